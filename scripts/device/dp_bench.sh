#!/usr/bin/env bash
# dp_train's GPU benchmark (HW5's comparison + bf16, both sync modes) beside ddp_anchor.py.
# usage: dp_bench.sh BUILD_DIR OUT_DIR NGPU        (called by scripts/gpu-check)
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2; ngpu=$3
runs=$out/dp_runs; mkdir -p "$runs"
anchors=.anchors; [ -d "$anchors" ] || anchors=../shared/anchors
gpt2p_device_data "$bin" "$out"
common=(--data "$data" --epochs ${DP_EPOCHS:-3} --translate-samples 0 --max-eval-pairs 64 --log-every 1000)
# No checkpoints, except in one run per precision below (--save-every 0: one per epoch), which
# shows the end-of-epoch save path works on the GPU build.
nosave=(--save-every -1)
run() {  # name np flags...
  local name=$1 np=$2; shift 2
  echo "== $name: mpirun -np $np dp_train $*" | tee -a "$out/dp.log"
  timeout ${DP_RUN_TIMEOUT:-150} mpirun -np "$np" "$bin/dp_train" "${common[@]}" --out "$runs/$name" "$@" \
    >>"$out/dp.log" 2>&1 || echo "!! $name failed (rc $?)" | tee -a "$out/dp.log"
}
# HW5: 1 GPU at batch 64 vs 2 GPUs at batch 128, fp32, sequence 128.
fp32=(--precision fp32 --seq-len 128 --max-train-pairs ${DP_FP32_PAIRS:-2560})
run fp32_1gpu 1 "${fp32[@]}" --batch-size 64 "${nosave[@]}"
# bf16, sequence 1024, 16 per GPU.
bf16=(--precision bf16 --seq-len 1024 --max-train-pairs ${DP_BF16_PAIRS:-1280})
run bf16_1gpu 1 "${bf16[@]}" --batch-size 16 "${nosave[@]}"
# The same with the head at every position, as a plain LM head computes it (and as the anchor does).
if [ "${DP_ALLPOS:-1}" = 1 ]; then
  run fp32_1gpu_allpos 1 "${fp32[@]}" --batch-size 64 --loss-positions all "${nosave[@]}"
  run bf16_1gpu_allpos 1 "${bf16[@]}" --batch-size 16 --loss-positions all "${nosave[@]}"
fi
if [ "$ngpu" -ge 2 ]; then
  for sync in ${DP_SYNCS:-bucketed per-param}; do
    save=("${nosave[@]}"); [ $sync = per-param ] && save=(--save-every 0)
    run fp32_2gpu_$sync 2 "${fp32[@]}" --batch-size 128 --grad-sync $sync "${save[@]}"
    [ $sync = per-param ] && [ "${DP_BF16_PER_PARAM:-1}" = 0 ] && continue
    run bf16_2gpu_$sync 2 "${bf16[@]}" --batch-size 32 --grad-sync $sync "${nosave[@]}"
  done
  # The tied wte reduced as one dense tensor after backward (the default gathers its lookup rows).
  if [ "${DP_DENSE:-1}" = 1 ]; then
    run fp32_2gpu_bucketed_dense 2 "${fp32[@]}" --batch-size 128 --embedding-sync dense "${nosave[@]}"
    run bf16_2gpu_bucketed_dense 2 "${bf16[@]}" --batch-size 32 --embedding-sync dense "${nosave[@]}"
  fi
  # Fewer NCCL CTAs: fewer SMs taken from backward's kernels while the buckets reduce
  # (DP_CTAS="8 4": one run per value and precision).
  for ctas in ${DP_CTAS:-}; do
    NCCL_MAX_CTAS=$ctas NCCL_MIN_CTAS=1 run fp32_2gpu_bucketed_ctas$ctas 2 "${fp32[@]}" --batch-size 128 "${nosave[@]}"
    NCCL_MAX_CTAS=$ctas NCCL_MIN_CTAS=1 run bf16_2gpu_bucketed_ctas$ctas 2 "${bf16[@]}" --batch-size 32 "${nosave[@]}"
  done
  # Gradients travelling in bf16: half the bytes of the all_reduce backward cannot hide.
  [ "${DP_BF16_REDUCE:-1}" = 1 ] &&
    run bf16_2gpu_bucketed_reduce-bf16 2 "${bf16[@]}" --batch-size 32 --grad-sync bucketed --reduce-dtype bf16 "${nosave[@]}"
fi
anchor_configs=${DP_ANCHOR_CONFIGS:-64x128xfp32,16x1024xbf16}
if [ "${DP_ANCHOR:-1}" = 1 ] && [ "$ngpu" -ge 2 ]; then
  CONFIGS=$anchor_configs PYTHONUNBUFFERED=1 timeout ${DP_ANCHOR_TIMEOUT:-400} python3 "$anchors/ddp_anchor.py" >"$out/ddp_anchor.jsonl" 2>"$out/ddp_anchor.err"
elif [ "${DP_ANCHOR:-1}" = 1 ]; then
  # One GPU: ddp_anchor.py's main() would also start its 2-GPU modes, whose second process cannot
  # get a device while the first waits for it. Run the anchor's own single-GPU mode directly.
  CONFIGS=$anchor_configs PYTHONUNBUFFERED=1 timeout ${DP_ANCHOR_TIMEOUT:-400} python3 - "$anchors" >"$out/ddp_anchor.jsonl" 2>"$out/ddp_anchor.err" <<'PY'
import json, os, queue, sys
sys.path.insert(0, sys.argv[1])
import ddp_anchor
for c in os.environ["CONFIGS"].split(","):
    b, s, prec = c.split("x")
    q = queue.Queue()
    ddp_anchor.run(0, 1, "single", int(b), int(s), prec, 29500, q)
    print(json.dumps(q.get()), flush=True)
PY
fi
python3 scripts/device/bench_table.py dp "$runs" "$out/ddp_anchor.jsonl" --json "$out/dp_summary.json" | tee "$out/dp_table.txt"
