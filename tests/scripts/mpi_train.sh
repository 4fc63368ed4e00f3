#!/usr/bin/env bash
# `mpirun -np 2 moetrain train`: the data-parallel loss curve equals one process with the same global batch, only
# rank 0 writes metrics (the memory keys reduced over the ranks), tp=2, pp=2 and cp=2 equal one process, a resumed
# dp=2 run continues exactly, an MoE model trains over ep=2 (each rank writing its checkpoint shard), and impossible
# layouts end with exit 2 naming keys.
# Usage: mpi_train.sh <moetrain> <source-dir> <scratch-dir>
set -euo pipefail
BIN=$1
SRC=$2
SCRATCH=$3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
cd "$SCRATCH"
fail() { echo "FAIL: $*" >&2; exit 1; }
# Open MPI: root containers need --allow-run-as-root; two ranks on a one-core machine need --oversubscribe.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
for i in $(seq 1 300); do printf 'Fortune %d: data parallel rank %d reads its slice.\n%%\n' "$i" $((i % 2)); done > corpus.txt
"$BIN" data --input corpus.txt --out bytes > /dev/null
COMMON=(--config "$SRC/configs/tiny.toml" --set run.threads=1 --set train.steps=6 --set train.batch_size=2
        --set train.seq_len=32 --set train.eval_every=3 --set train.eval_batches=2 --set checkpoint.every_steps=3
        --set 'data.paths=["bytes/train.bin"]' --set 'data.val_paths=["bytes/val.bin"]' --set run.device=cpu)

"$BIN" train "${COMMON[@]}" --set run.dir=single --set train.grad_accum=2 > single.txt
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=dp2 > dp2.txt 2> dp2.err || fail "dp=2 run: $(cat dp2.err)"
grep -q "x 2 processes, tp=1 cp=1 ep=1 dp=2 pp=1" dp2.txt || fail "no mesh line: $(cat dp2.txt)"
[[ $(grep -c "step      6/6 | loss" dp2.txt) -eq 1 ]] || fail "expected one progress line per step (rank 0 only)"
# Loss, gradient norm and validation loss of two runs' metrics.jsonl within 1e-5 (relative), printed as LABEL.
same_curves() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
a_path, b_path, label = sys.argv[1:4]
def series(path, kind, key):
    return [json.loads(l)[key] for l in open(path) if json.loads(l)["kind"] == kind]
worst = 0.0
for kind, key in (("train", "loss"), ("train", "grad_norm"), ("eval", "val_loss")):
    a, b = series(a_path, kind, key), series(b_path, kind, key)
    assert len(a) == len(b) > 0, (kind, len(a), len(b))
    worst = max([worst] + [abs(x - y) / abs(x) for x, y in zip(a, b)])
print(f"mpi_train: {label}, 6 steps: max relative difference {worst:.2e}")
assert worst < 1e-5, worst
PY
}
same_curves single/metrics.jsonl dp2/metrics.jsonl "dp=2 vs one process (grad_accum 2)" || fail "loss curves differ"
/usr/bin/python3 - <<'PY' || fail "dp=2 metrics"
import json
head = json.loads(open("dp2/metrics.jsonl").readline())
assert head["kind"] == "config" and head["mesh"]["dp"] == 2 and head["mesh"]["world"] == 2, head["mesh"]
# The memory keys come through the reduction over the ranks (each the largest over them).
for j in map(json.loads, open("dp2/metrics.jsonl")):
    if j["kind"] == "train":
        assert j["mem/peak"] >= j["mem/allocated"] > 0 and 0 <= j["mem/peak_activations"] < j["mem/peak"], j
PY

# Tensor parallelism (sequence parallel, the vocabulary of 257 padded to 258): both ranks read one batch, so the
# same loss curve as one process with grad_accum 1.
"$BIN" train "${COMMON[@]}" --set run.dir=single1 > single1.txt
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=tp2 --set parallel.tp=2 > tp2.txt 2> tp2.err ||
  fail "tp=2 run: $(cat tp2.err)"
grep -q "x 2 processes, tp=2 cp=1 ep=1 dp=1 pp=1" tp2.txt || fail "no tp mesh line: $(cat tp2.txt)"
same_curves single1/metrics.jsonl tp2/metrics.jsonl "tp=2 vs one process" || fail "tp=2 loss curve differs"
# Pipeline parallelism (1F1B over the 4 layers, tied embeddings): the same curve, and the bubble in the metrics.
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=pp2 --set parallel.pp=2 > pp2.txt 2> pp2.err ||
  fail "pp=2 run: $(cat pp2.err)"
same_curves single1/metrics.jsonl pp2/metrics.jsonl "pp=2 vs one process" || fail "pp=2 loss curve differs"
grep -q '"pp/bubble":0.5' pp2/metrics.jsonl || fail "no pp/bubble of (2 - 1) / (1 + 2 - 1): $(head -3 pp2/metrics.jsonl)"

# Context parallelism (cp = 2, the zigzag over 256-token rows, 4 chunks of 64): both ranks read one batch, the same
# loss curve as one process at that length, and the cp group's traffic in the metrics.
"$BIN" train "${COMMON[@]}" --set run.dir=single256 --set train.seq_len=256 > single256.txt
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=cp2 --set parallel.cp=2 --set train.seq_len=256 \
  > cp2.txt 2> cp2.err || fail "cp=2 run: $(cat cp2.err)"
grep -q "x 2 processes, tp=1 cp=2 ep=1 dp=1 pp=1" cp2.txt || fail "no cp mesh line: $(cat cp2.txt)"
same_curves single256/metrics.jsonl cp2/metrics.jsonl "cp=2 vs one process" || fail "cp=2 loss curve differs"
/usr/bin/python3 - <<'PY' || fail "cp=2 metrics"
import json
for j in map(json.loads, open("cp2/metrics.jsonl")):
    if j["kind"] == "train":
        assert j["comm/cp/bytes"] > 0 and j["comm/cp/calls"] > 0, j
PY

# Resume: drop the last checkpoint and continue from step 3 under the same mesh; steps 4-6 must repeat exactly.
cp -r dp2 dp2_resume
rm -rf dp2_resume/checkpoints/step_00000006
head -n 5 dp2/metrics.jsonl > dp2_resume/metrics.jsonl
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=dp2_resume --resume > resume.txt 2> resume.err ||
  fail "resume: $(cat resume.err)"
grep -q "resumed from dp2_resume/checkpoints/step_00000003 at step 3" resume.txt || fail "no resume: $(cat resume.txt)"
/usr/bin/python3 - <<'PY' || fail "resumed losses differ"
import json
def train(path):
    return {j["step"]: j["loss"] for j in map(json.loads, open(path)) if j["kind"] == "train"}
a, b = train("dp2/metrics.jsonl"), train("dp2_resume/metrics.jsonl")
assert all(a[s] == b[s] for s in (4, 5, 6)), (a, b)
PY

# Impossible layouts: exit 2 and the keys named, from every launcher path.
set +e
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=bad --set parallel.dp=3 > /dev/null 2> bad1.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "dp=3 on 2 processes: exit $rc, expected 2: $(cat bad1.err)"
grep -q "parallel.tp x cp x ep x dp x pp = 1 x 1 x 1 x 3 x 1 = 3, but the job has 2 processes" bad1.err ||
  fail "dp=3 message: $(cat bad1.err)"
set +e
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=bad --set parallel.ep=2 > /dev/null 2> bad2.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "ep=2 on a dense model: exit $rc, expected 2: $(cat bad2.err)"
grep -q "parallel.ep = 2 needs an MoE model" bad2.err || fail "ep=2 message: $(cat bad2.err)"
set +e
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=bad --set parallel.cp=2 > /dev/null 2> bad3.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "cp=2: exit $rc, expected 2: $(cat bad3.err)"
grep -q "train.seq_len = 32 is not a multiple of 2 x parallel.cp x 64 = 256" bad3.err ||
  fail "cp=2 message: $(cat bad3.err)"
set +e
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=bad --set parallel.tp=2 --set model.n_heads=1 \
  --set model.n_kv_heads=1 > /dev/null 2> bad5.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "tp=2 over 1 head: exit $rc, expected 2: $(cat bad5.err)"
grep -q "model.n_heads = 1 is not divisible by parallel.tp = 2" bad5.err || fail "tp message: $(cat bad5.err)"
set +e
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=bad --set moe.enabled=true --set moe.num_experts=3 \
  --set moe.top_k=2 --set moe.expert_ffn_dim=64 --set parallel.ep=2 > /dev/null 2> bad4.err
rc=$?
set -e
[[ $rc -eq 2 ]] || fail "3 experts over ep=2: exit $rc, expected 2: $(cat bad4.err)"
grep -q "moe.num_experts = 3 is not divisible by parallel.ep = 2" bad4.err || fail "ep message: $(cat bad4.err)"

# Expert parallelism from the command line: an MoE model over ep = 2, ZeRO-1 reported on the first line.
"${MPIRUN[@]}" "$BIN" train "${COMMON[@]}" --set run.dir=ep2 --set moe.enabled=true --set moe.num_experts=4 \
  --set moe.top_k=2 --set moe.expert_ffn_dim=64 --set parallel.ep=2 > ep2.txt 2> ep2.err || fail "ep=2: $(cat ep2.err)"
grep -q "x 2 processes, tp=1 cp=1 ep=2 dp=1 pp=1" ep2.txt || fail "no ep mesh line: $(cat ep2.txt)"
grep -q "ZeRO-1: sharded over the data-parallel ranks" ep2.txt || fail "no ZeRO-1 line: $(cat ep2.txt)"
[[ -f ep2/checkpoints/step_00000006/rank_00001.safetensors ]] || fail "rank 1 wrote no checkpoint shard"
echo "mpi_train: ok"
