#!/usr/bin/env bash
# The long-document data and the curriculum through the CLI: `moetrain data --long-doc` tags a directory tree as one
# long document (train.docs), refuses a missing or text-less input with exit 3 naming it and leaves no files behind;
# a short configs/tiny_curriculum.toml run switches stage, writes the long_stage events with the passkey eval and the
# long/* metrics on every train line; `moetrain plan --memory` sizes the longest stage; bad [[long.stages]] are exit 2
# naming the key. Sequence segments through the trainer train as one pass does (long/segments counts them), and
# long/max_logit is on every train line.
# Usage: long_context.sh <moetrain> <source-dir> <scratch-dir>
source "$(dirname "$0")/lib/cli_common.sh" "$@"

mkdir -p tree/sub
for i in $(seq 1 40); do echo "Section $i of the long manual: every token may attend to every earlier token."; done > tree/a.txt
for i in $(seq 1 40); do echo "Appendix $i: the state of a linear layer has a fixed size."; done > tree/sub/b.txt
printf 'binary\0data' > tree/c.bin
echo compressed > tree/d.gz
ln -s a.txt tree/link.txt
"$BIN" data --input corpus.txt --long-doc tree --out long > data.log 2>&1 || fail "data --long-doc exited $?: $(cat data.log)"
grep -q "1 long document(s) tagged long" data.log || fail "no long-document line: $(cat data.log)"
/usr/bin/python3 - long tree << 'EOF2' || fail "train.docs does not tag the long document"
import json, os, struct, sys
out, tree = sys.argv[1], sys.argv[2]
b = open(f"{out}/train.docs", "rb").read()
assert b[:8] == b"MTDOCS\0\0", b[:8]
version, header, payload, crc, flags = struct.unpack("<IIQII", b[8:32])
docs, tokens = struct.unpack("<QQ", b[32:48])
assert (version, header, flags) == (1, 64, 0) and len(b) == header + payload == 64 + 16 * docs, (version, header, payload)
recs = [struct.unpack("<QQ", b[64 + 16 * i : 80 + 16 * i]) for i in range(docs)]
assert sum(l for l, _ in recs) == tokens == (os.path.getsize(f"{out}/train.bin") - 1024) // 2, tokens
tagged = [l for l, f in recs if f & 1]
# a.txt then sub/b.txt (sorted paths; the binary, the .gz and the link skipped), plus the EOT, one byte a token.
want = os.path.getsize(f"{tree}/a.txt") + os.path.getsize(f"{tree}/sub/b.txt") + 1
assert tagged == [want], (tagged, want)
assert all(l < want for l, f in recs if not f & 1)
stats = json.load(open(f"{out}/stats.json"))
assert stats["long"] == {"documents": 1, "tokens": want}, stats["long"]
EOF2

"$BIN" data --input corpus.txt --long-doc no/such/dir --out missing > out.txt 2> err.txt
rc=$?
[[ $rc -eq 3 ]] || fail "a missing --long-doc exited $rc, expected 3"
grep -q "long document input not found \[no/such/dir\]" err.txt || fail "the error does not name the path: $(cat err.txt)"
[[ -z $(ls -A missing 2> /dev/null) ]] || fail "files left behind: $(ls missing)"
mkdir -p binonly && printf 'x\0y' > binonly/x.bin
"$BIN" data --input corpus.txt --long-doc binonly --out empty > out.txt 2> err.txt
rc=$?
[[ $rc -eq 3 ]] || fail "a --long-doc without text exited $rc, expected 3"
grep -q "holds no text file \[binonly\]" err.txt || fail "the error does not name the path: $(cat err.txt)"
[[ -z $(ls -A empty 2> /dev/null) ]] || fail "files left behind: $(ls empty)"

# Two stages of 2 steps: 64 tokens on the natural mix, then 256 with a quarter of the rows long (the passkey fits).
CUR=(--config "$SRC/configs/tiny_curriculum.toml" --set 'data.paths=["long/train.bin"]'
     --set 'data.val_paths=["long/val.bin"]' --set train.batch_size=2 --set run.threads=1 --set train.eval_every=0
     --set train.steps=5 --set checkpoint.every_steps=0
     --set 'long.stages=[{seq_len=64, tokens=256}, {seq_len=256, tokens=1024, long_fraction=0.25}]')
"$BIN" train "${CUR[@]}" --set run.dir=cur > cur.log 2>&1 || fail "curriculum training exited $?: $(cat cur.log)"
grep -qE '^step +2/5 \| curriculum stage 1: seq_len 256, long fraction 0.25' cur.log || fail "no stage line: $(cat cur.log)"
grep -qE '^step +2/5 \| passkey at 256 tokens: key loss [0-9.]+' cur.log || fail "no passkey line: $(cat cur.log)"
/usr/bin/python3 - cur/metrics.jsonl << 'EOF2' || fail "metrics.jsonl long-context keys"
import json, math, sys
lines = list(map(json.loads, open(sys.argv[1])))
train = [l for l in lines if l["kind"] == "train"]
assert len(train) == 5, len(train)
for l in train:
    stage, seq = (0, 64) if l["step"] <= 2 else (1, 256)
    assert (l["long/stage"], l["long/seq_len"], l["long/segments"]) == (stage, seq, 1), l
    rms = [l[f"long/kda_state_rms/l{i:02d}"] for i in range(3)]
    assert all(0 < r < 100 for r in rms), rms
    assert "long/kda_state_rms/l03" not in l, "layer 3 is attention"
    assert math.isfinite(l["long/max_logit/l03"]) and "long/max_logit/l00" not in l, l
    assert 0 <= l["long/long_share"] <= 1 and 0 <= l["long/stage_long_share"] <= 1, l
    assert l["mem/peak"] > 0
assert [l["tokens_seen"] for l in train] == [128, 256, 768, 1280, 1792], [l["tokens_seen"] for l in train]
# Stage 1: 2 rows a step, a quarter long; the stage's share over its 6 rows is a whole number of rows.
s1 = [l for l in train if l["long/stage"] == 1]
assert all(abs(l["long/stage_long_share"] * l["long/stage_tokens"] / 256 - round(l["long/stage_long_share"] * l["long/stage_tokens"] / 256)) < 1e-9 for l in s1)
assert abs(s1[-1]["long/stage_replay_share"] + s1[-1]["long/stage_long_share"] - 1) < 1e-12
events = [l for l in lines if l["kind"] == "event" and l["event"] == "long_stage"]
assert [(e["step"], e["stage"], e["seq_len"]) for e in events] == [(0, 0, 64), (2, 1, 256)], events
assert "skipped" in events[0]["passkey"], events[0]
p = events[1]
assert len(p["passkey/loss_by_depth"]) == 10 and len(p["passkey/depth"]) == 10
assert all(math.isfinite(x) and x > 0 for x in p["passkey/loss_by_depth"]), p
assert 0 < p["passkey/p_key"] < 1 and abs(sum(p["passkey/loss_by_depth"]) / 10 - p["passkey/loss"]) < 1e-9
EOF2

# Sequence segments of 64 tokens (long.segment_tokens): one segment at 64, four at 256, the same training as one pass
# (the model's segments equal one pass; here the trainer, the passkey eval and the metrics run them).
"$BIN" train "${CUR[@]}" --set run.dir=seg --set long.segment_tokens=64 > seg.log 2>&1 ||
  fail "segmented training exited $?: $(cat seg.log)"
/usr/bin/python3 - cur/metrics.jsonl seg/metrics.jsonl << 'EOF4' || fail "segmented run vs one pass"
import json, sys
one, seg = ([l for l in map(json.loads, open(f)) if l["kind"] == "train"] for f in sys.argv[1:])
assert [l["long/segments"] for l in seg] == [1, 1, 4, 4, 4], [l["long/segments"] for l in seg]
for a, b in zip(one, seg):
    assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])
EOF4

# A resume inside stage 0 (a checkpoint after step 1) writes no second stage-0 event: the log holds one event per
# stage start, at steps 0 and 2.
"$BIN" train "${CUR[@]}" --set run.dir=res --set train.steps=1 --set checkpoint.every_steps=1 > res1.log 2>&1 ||
  fail "the first half exited $?: $(cat res1.log)"
"$BIN" train "${CUR[@]}" --set run.dir=res --set checkpoint.every_steps=1 --resume > res2.log 2>&1 ||
  fail "the resume exited $?: $(cat res2.log)"
/usr/bin/python3 - res/metrics.jsonl << 'EOF3' || fail "stage events after a resume inside stage 0: $(grep long_stage res/metrics.jsonl)"
import json, sys
events = [l for l in map(json.loads, open(sys.argv[1])) if l["kind"] == "event" and l["event"] == "long_stage"]
assert [(e["step"], e["stage"]) for e in events] == [(0, 0), (2, 1)], events
EOF3

# The Megatron format gets its index too (train.docs beside train.bin and train.idx), and the curriculum reads it.
"$BIN" data --input corpus.txt --long-doc tree --format megatron --out meg > data.log 2>&1 || fail "megatron data exited $?"
[[ -s meg/train.docs && -s meg/train.idx ]] || fail "no meg/train.docs: $(ls meg)"
"$BIN" train "${CUR[@]}" --set run.dir=megrun --set data.format=megatron --set 'data.paths=["meg/train"]' \
  --set 'data.val_paths=["meg/val"]' --set train.steps=3 > meg.log 2>&1 || fail "megatron curriculum exited $?: $(cat meg.log)"
grep -q "curriculum of 2 stages over 286 documents (1 tagged long)" meg.log || fail "megatron index: $(head -3 meg.log)"

# The planner sizes the longest stage: 8 x 512 for configs/tiny_curriculum.toml (train.seq_len is 128).
"$BIN" plan --memory --config "$SRC/configs/tiny_curriculum.toml" > plan.txt 2>&1 || fail "plan exited $?: $(cat plan.txt)"
grep -qE '^  batch +8 x 512 = 4,096 tokens' plan.txt || fail "the plan is not of the longest stage: $(head -4 plan.txt)"

COMMON=("${CUR[@]}")
bad_setting "long.stages[1].seq_len = 128 is not above long.stages[0].seq_len = 256" \
  'long.stages=[{seq_len=256, tokens=10}, {seq_len=128, tokens=10}]'
bad_setting "long.stages[0].seq_len = 1024 exceeds model.max_seq_len = 512" 'long.stages=[{seq_len=1024, tokens=10}]'
bad_setting "long.stages[0].long_fraction = 2 is out of range" 'long.stages=[{seq_len=64, tokens=10, long_fraction=2}]'
bad_setting "long.stages[0].tokens = 0 is out of range" 'long.stages=[{seq_len=64, tokens=0}]'
bad_setting "long.segment_tokens = 100 is not a multiple of kda.chunk_size = 64" 'long.segment_tokens=100'
finish long_context
