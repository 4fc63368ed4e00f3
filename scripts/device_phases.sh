#!/usr/bin/env bash
# One device call from a packed build (scripts/pack_device_build.sh), as a list of phases run in order within a time
# budget: a phase that would not fit in what is left is skipped (and says so), so a call that starts late still
# returns what it measured. Logs go under $OUT (one file per phase); JSON lines are also printed, because stdout
# comes back in full where a file under $OUT may not.
#   PHASES="label attention_ab" CALL_BUDGET=570 bash scripts/device_phases.sh
# On the device (carry [".device-deps", ".devbin"]), in the repository root:
#   label          the whole gpu label, ctest -j GPU_J (default 14: the GPU tests are mostly small; the whole label
#                  took 327 s on an H100 at 433 entries)
#   label_left     the gpu tests a previous label log did not see pass: LABEL_LOG names that log (ctest's output,
#                  brought back from an earlier call), so a label cut off by the time limit is finished in a second
#                  call instead of rerun
#   tests          the gpu tests whose names match GPU_FILTER (a ctest -R regex): a change's own GPU tests, in a
#                  call whose time does not allow the whole label
#   attention_ab   bench_attention --no-extra, deterministic (the ordered 5-matmul backward), --deterministic-bwd (the
#                  two-kernel one) and --nondeterministic, of build/bench/bench_attention and
#                  of every executable in AB_DIR (default .devbin/ab: older builds' bench_attention for a before/after
#                  comparison), alternated ROUNDS times (default 2), then PyTorch's SDPA reference
#   dispatch       bench/dispatch_overlap.sh on kimi_linear_mini (issue 28)
#   kda            bench_kda at the keep levels states_bf16 (the default), none and all, then fla's chunk_kda at the
#                  same shapes (tools/reference/bench_kda_fla.py; carry .fla, fla's source; its Triton compile takes a few
#                  minutes of the call): the KDA row of issue 25 in one call
#   kda_cp         bench_kda_cp --t 65536 --spans 2,4,8,16 (issue 28)
#   checkpoint     bench/checkpoint_cost.sh async at EVERY 150 on kimi_linear_mini (issue 27)
#   checkpoint_ab  checkpoint with this build's moetrain and .devbin/old/moetrain.xz's, alternated ROUNDS (1) times
#   checkpoint_shm checkpoint with the run directory in /dev/shm (checkpoints on the disk), then as usual (issue 27)
#   checkpoint_hybrid  checkpoint on hybrid_1b3 (async, EVERY 50) (issue 27)
#   checkpoint_devgemm checkpoint with moe.grouped_gemm = "device" (no host copy of the expert offsets): whether the
#                  steps beside the write are slower because the loop waits on the host (issue 27)
#   restart        bench/checkpoint_cost.sh restart on kimi_linear_mini, EVERY 150: a SIGKILL under the supervisor,
#                  the downtime to the first resumed step, the expected lost progress (issue 27)
#   metrics        bench/checkpoint_cost.sh metrics on kimi_linear_mini, 16 steps (issue 27)
#   muon           bench_muon, then kimi_linear_mini steps with AdamW and with Muon, profiled (issue 29)
#   exp_a          issue 29's GPU-sized experiment A: its Muon and AdamW runs (A_RUNS), the finished ones carried
#                  into the next call as .devbin/optq.tar.xz (this call's $OUT/optq.tar.xz)
#   muon_models    bench_train --profile of dense_1b3 and hybrid_1b3 with AdamW and with Muon (issue 29)
#   graphs         train.cuda_graphs (issue 25 item 7): the GpuGraphs tests, then bench_train of tiny, tiny_hybrid,
#                  dense_1b3 and hybrid_1b3 (or GRAPH_MODELS) without and with graphs, alternated ROUNDS (default 2)
#                  times
#   grads_ab       bench_train kimi_linear_mini and dense_1b3, then bench_moe (64 and 256 experts), of this build and of
#                  .devbin/ab_old.tar.xz's bench_train_old / bench_moe_old, alternated ROUNDS (default 2) times; and
#                  why tiny.toml's steps run without CUDA graphs (the step's first weight gradient written, issue 25)
# kimi_linear_mini runs at its batch 4 on a card of more than 100 GB, else at batch 2 (a config copy under $OUT).
set -u
t0=$SECONDS
budget=${CALL_BUDGET:-570}
left() { echo $((budget - (SECONDS - t0))); }
source .device-deps/device-setup.sh > /dev/null 2>&1
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }  # the CTest files name /work/main/build
tar -xJf .devbin/build.tar.xz
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,memory.total --format=csv | tee "$OUT/gpu.txt"
kimi=configs/kimi_linear_mini.toml
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if ((mem < 100000)); then
    kimi=$OUT/kimi_linear_mini_b2.toml
    sed 's/^batch_size = 4/batch_size = 2/' configs/kimi_linear_mini.toml > "$kimi"
fi
echo "setup: $((SECONDS - t0)) s; kimi_linear_mini config: $kimi"

need() {  # need SECONDS: true when that much is left, else says the phase is skipped
    (($(left) >= $1)) && return 0
    echo "skipped: $(left) s left, the phase needs $1"
    return 1
}

for phase in ${PHASES:-label}; do
    echo "== $phase ($(left) s left)"
    case $phase in
        label)
            need 200 || continue
            timeout $(($(left) - 10)) ctest --test-dir build -L gpu -j "${GPU_J:-14}" --timeout 300 \
                --output-on-failure > "$OUT/label.log" 2>&1
            grep -E "tests passed|\*\*\*|Failed|Not Run" "$OUT/label.log" | tail -20
            ;;
        label_left)
            need 60 || continue
            ids=$(ctest --test-dir build -N -L gpu | sed -nE 's/.*Test +#([0-9]+): ([^ ]+).*/\1 \2/p' |
                while read -r id name; do
                    grep -qE "Test +#$id: $name \.+ +Passed" "${LABEL_LOG:?LABEL_LOG names the earlier log}" ||
                        printf ',%s' "$id"
                done)
            echo "tests left:${ids:- none}"
            [ -n "$ids" ] || continue
            timeout $(($(left) - 10)) ctest --test-dir build -I "0,0,0$ids" -j "${GPU_J:-14}" --timeout 300 \
                --output-on-failure > "$OUT/label_left.log" 2>&1
            grep -E "tests passed|\*\*\*|Failed|Not Run" "$OUT/label_left.log" | tail -20
            ;;
        tests)
            need 60 || continue
            [ -n "${GPU_FILTER:-}" ] || { echo "skipped: GPU_FILTER names no tests"; continue; }
            timeout $(($(left) - 10)) ctest --test-dir build -L gpu -R "$GPU_FILTER" \
                -j "${GPU_J:-14}" --timeout 300 --output-on-failure > "$OUT/tests.log" 2>&1
            grep -E "tests passed|\*\*\*|Failed|Not Run" "$OUT/tests.log" | tail -20
            ;;
        attention_ab)
            need 120 || continue
            bins=(build/bench/bench_attention)
            for b in "${AB_DIR:-.devbin/ab}"/*; do [ -x "$b" ] && bins+=("$b"); done
            for round in $(seq "${ROUNDS:-2}"); do
                for b in "${bins[@]}"; do
                    for mode in deterministic two_kernel nondeterministic; do
                        flag=""
                        [ $mode = nondeterministic ] && flag=--nondeterministic
                        [ $mode = two_kernel ] && flag=--deterministic-bwd
                        timeout 120 "$b" --no-extra $flag 2>&1 | grep '^{"B"' |
                            sed "s|^{|{\"binary\":\"$b\",\"mode\":\"$mode\",\"round\":$round,|" |
                            tee -a "$OUT/attention_ab.jsonl"
                    done
                done
            done
            python3 tools/reference/bench_attention_torch.py 2>&1 | grep '^{' | tee -a "$OUT/attention_ab.jsonl"
            ;;
        dispatch)
            need 200 || continue
            bash bench/dispatch_overlap.sh build "$kimi" 2 --steps 6 --warmup 2 2>&1 | tee "$OUT/dispatch.log" |
                grep '^{'
            ;;
        kda)
            need 120 || continue
            timeout 180 build/bench/bench_kda --keep states_bf16,none,all --doc-tokens 0 2>&1 | tee "$OUT/kda.log" |
                grep '^{'
            if [ -d .fla ] && (($(left) > 60)); then
                timeout $(($(left) - 20)) python3 tools/reference/bench_kda_fla.py --fla .fla 2>&1 |
                    tee -a "$OUT/kda.log" | grep '^{'
            else
                echo "fla: skipped (no .fla carried, or $(left) s left)"
            fi
            ;;
        kda_cp)
            need 60 || continue
            timeout $(($(left) - 10)) build/bench/bench_kda_cp --t 65536 --spans 2,4,8,16 --iters 3 2>&1 |
                tee "$OUT/kda_cp.log" | grep '^{'
            ;;
        checkpoint)
            need 150 || continue
            timeout $(($(left) - 10)) bash bench/checkpoint_cost.sh build checkpoint "$kimi" async 150 6 2>&1 |
                tee "$OUT/checkpoint.log" | grep '^{'
            ;;
        checkpoint_ab)
            # checkpoint, alternated ROUNDS times (default 1) between this build's moetrain and the one in
            # .devbin/old (moetrain.xz, an older build's binary, unpacked here)
            [ -f .devbin/old/moetrain.xz ] && xz -dkf .devbin/old/moetrain.xz && chmod +x .devbin/old/moetrain
            for round in $(seq "${ROUNDS:-1}"); do
                for b in build .devbin/old; do
                    need 100 || break
                    [ -x $b/moetrain ] || continue
                    timeout $(($(left) - 10)) bash bench/checkpoint_cost.sh $b checkpoint "$kimi" async 150 6 2>&1 |
                        tee -a "$OUT/checkpoint_ab.log" | grep '^{"bench": "checkpoint"' |
                        sed "s|^{|{\"binary\": \"$b\", \"round\": $round, |"
                done
            done
            ;;
        checkpoint_shm)
            # checkpoint with the run directory in memory (RUN_DIR_SHM), then as usual, alternated: the loop's own
            # file writes behind the checkpoint's writeback, or not
            for shm in 1 ""; do
                need 100 || break
                RUN_DIR_SHM=$shm timeout $(($(left) - 10)) bash bench/checkpoint_cost.sh build checkpoint "$kimi" \
                    async 150 6 2>&1 | tee -a "$OUT/checkpoint_shm.log" | grep '^{"bench": "checkpoint"' |
                    sed "s|^{|{\"run_dir_shm\": \"$shm\", |"
            done
            ;;
        checkpoint_devgemm)
            need 100 || continue
            TRAIN_SET='moe.grouped_gemm="device"' timeout $(($(left) - 10)) bash bench/checkpoint_cost.sh build \
                checkpoint "$kimi" async 150 6 2>&1 | tee "$OUT/checkpoint_devgemm.log" | grep '^{'
            ;;
        checkpoint_hybrid)
            # hybrid_1b3 at its batch 4 (67 GB on the device; a ~16 GB checkpoint, about 10 s of write: EVERY 50)
            need 120 || continue
            timeout $(($(left) - 10)) bash bench/checkpoint_cost.sh build checkpoint configs/hybrid_1b3.toml async 50 \
                6 2>&1 | tee "$OUT/checkpoint_hybrid.log" | grep '^{'
            ;;
        restart)
            need 150 || continue
            KEEP_LOG=$OUT/restart_train.log timeout $(($(left) - 10)) bash bench/checkpoint_cost.sh build restart \
                "$kimi" 150 6 2>&1 |
                tee "$OUT/restart.log" | grep '^{'
            ;;
        metrics)
            need 120 || continue
            timeout $(($(left) - 10)) bash bench/checkpoint_cost.sh build metrics "$kimi" 16 2>&1 |
                tee "$OUT/metrics.log" | grep '^{'
            ;;
        muon)
            need 120 || continue
            timeout $(($(left) - 10)) build/bench/bench_muon --iters 5 2>&1 | tee "$OUT/muon.log" | grep '^{'
            for opt in adamw muon; do
                timeout 120 build/bench/bench_train --config "$kimi" --set "optim.name=\"$opt\"" --steps 4 \
                    --warmup 2 --profile > "$OUT/step_$opt.log" 2>&1
                grep '^{' "$OUT/step_$opt.log" | head -1
            done
            ;;
        exp_a)
            # issue 29's GPU-sized experiment A (A_RUNS, default both: Muon's run, ~5 min, then AdamW's, ~3.5; a
            # run the call's end cuts off is redone by the next call, which carries the finished ones back in as
            # .devbin/optq.tar.xz, this call's $OUT/optq.tar.xz): kimi_linear_mini at
            # batch 1 x 1,024 on the fortunes (.devbin/fortunes.tar.xz: `moetrain data --out data/fortunes` made
            # here; the device has no Debian fortunes), 2,000 steps: 2.05M tokens, under one pass of the 2.43M
            need 200 || continue
            [ -f data/fortunes/train.bin ] || { mkdir -p data && tar -xJf .devbin/fortunes.tar.xz -C data; }
            d=/tmp/optq
            mkdir -p $d
            [ -f .devbin/optq.tar.xz ] && tar -xJf .devbin/optq.tar.xz -C $d
            A_RUNS=${A_RUNS:-muon adamw} A_CONFIG=kimi_linear_mini A_EVAL_BATCHES=8 NICE=0 \
                A_EXTRA="--set run.device=cuda --set train.batch_size=1 --set train.seq_len=1024" \
                timeout $(($(left) - 15)) bash bench/optimizer_quality.sh build/moetrain $d A 2>&1 |
                tee "$OUT/exp_a.log" | grep '^{'
            tar -cJf "$OUT/optq.tar.xz" -C $d runs
            ;;
        graphs)
            need 120 || continue
            timeout 120 ctest --test-dir build -L gpu -R GpuGraphs --output-on-failure > "$OUT/graphs_tests.log" 2>&1
            grep -E "tests passed|\*\*\*|Failed|captures" "$OUT/graphs_tests.log"
            for round in $(seq "${ROUNDS:-2}"); do
                for model in ${GRAPH_MODELS:-tiny tiny_hybrid dense_1b3 hybrid_1b3}; do
                    for graphs in false true; do
                        need 60 || break 3
                        timeout 150 build/bench/bench_train --config configs/$model.toml --steps 10 --set run.device=cuda \
                            --warmup 3 --set train.cuda_graphs=$graphs > "$OUT/graphs_${model}_$graphs.log" 2>&1
                        grep -E '^\{|cuda_graphs' "$OUT/graphs_${model}_$graphs.log" | head -2
                    done
                done
            done
            ;;
        muon_models)
            # Muon against AdamW in dense_1b3's and hybrid_1b3's steps (issue 29's other two models)
            for model in dense_1b3 hybrid_1b3; do
                for opt in adamw muon; do
                    need 60 || break 2
                    timeout 150 build/bench/bench_train --config configs/$model.toml --set "optim.name=\"$opt\"" \
                        --steps 4 --warmup 2 --profile > "$OUT/step_${model}_$opt.log" 2>&1
                    grep '^{"batch' "$OUT/step_${model}_$opt.log" | head -1
                    grep -E '"range":"(optimizer|muon_step|adamw_step_list)"' "$OUT/step_${model}_$opt.log"
                done
            done
            ;;
        grads_ab)
            need 150 || continue
            tar -xJf .devbin/ab_old.tar.xz  # ab/bench_train_old, ab/bench_moe_old
            old=ab
            build/bench/bench_train --config configs/tiny.toml --steps 3 --warmup 1 --set run.device=cuda \
                --set train.cuda_graphs=true 2>&1 | grep -iE "graph" | head -3
            for round in $(seq "${ROUNDS:-2}"); do
                for b in build/bench/bench_train "$old/bench_train_old"; do
                    for cfg in "$kimi" configs/dense_1b3.toml; do
                        need 40 || break 3
                        timeout 120 "$b" --config "$cfg" --steps 6 --warmup 2 2>&1 | grep '^{"batch' |
                            sed "s|^{|{\"binary\":\"$b\",\"round\":$round,|" | tee -a "$OUT/grads_ab.jsonl"
                    done
                done
            done
            for b in build/bench/bench_moe "$old/bench_moe_old"; do
                need 60 || break
                timeout 150 "$b" --experts 64,256 --grouped-gemm auto 2>&1 | grep '^{' |
                    sed "s|^{|{\"binary\":\"$b\",|" | tee -a "$OUT/grads_ab.jsonl"
            done
            ;;
        *) echo "unknown phase $phase" ;;
    esac
    echo "   $phase done at $((SECONDS - t0)) s"
done
# The test counts again at the end, where a long call's cut output still shows them.
# A run cut by the call's time has no ctest summary: its log's result lines are counted instead.
for log in "$OUT"/label.log "$OUT"/label_left.log "$OUT"/tests.log "$OUT"/graphs_tests.log; do
    [ -f "$log" ] || continue
    summary=$(grep -E "tests passed" "$log" | tail -1)
    [ -n "$summary" ] || summary="cut before its summary: $(grep -cE "Test +#[0-9]+: .* Passed" "$log") passed, \
$(grep -cE "Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout)" "$log") failed so far; failed: \
$(grep -E "Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout)" "$log" | sed -E 's/.*#[0-9]+: ([^ ]+).*/\1/' | tr '\n' ' ')"
    echo "$(basename "$log"): $summary"
done
echo "call done at $((SECONDS - t0)) s"
