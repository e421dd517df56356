#!/usr/bin/env bash
# pp_train's GPU benchmark beside pp_anchor.py, on 2 GPUs. Settings:
#   fp32   batch 64, sequence 128            model_parallel; 1F1B M 2 4 8 16; GPipe M 4 8;
#                                            interleaved (2 stages per rank) M 2 4 8
#   bf16   batch 32, sequence 1024 autocast  the same
#   hw5    batch 96, sequence 128, fp32      HW5's comparison: model_parallel; 1F1B M 2 4 8; GPipe M 2;
#                                            interleaved M 2 4 8
#   uniform partition (fp32): model_parallel and 1F1B M 8  (everything else: $PP_PARTITION,
#   default balanced; measured = balanced by the layer times pp_train measures first)
#   Every setting also runs 1F1B M $PP_ZB_MS_1F1B (2 4 8) and interleaved M $PP_ZB_MS_INTERLEAVED
#   (4 8) with --zero-bubble (empty lists skip them).
#   PP_SETTINGS="fp32 bf16" picks the first two settings (hw5 runs unless PP_HW5=0); PP_EXTRA holds
#   flags added to every run (e.g. "--dropout 0", as pp_anchor.py's model has no dropout).
# Runs: 2 epochs (hw5: 3) over a few hundred pairs, no checkpoints. bench_table.py reports the
# median step after the first epoch (the anchor reports a median step too) and the speed-up over
# the setting's model_parallel run; analysis/ takes HW5's epoch metrics from the same files.
# usage: pp_bench.sh BUILD_DIR OUT_DIR          (called by scripts/gpu-check)
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2
runs=$out/pp_runs; mkdir -p "$runs"
anchors=.anchors; [ -d "$anchors" ] || anchors=../shared/anchors
gpt2p_device_data "$bin" "$out"
common=(--data "$data" --translate-samples 0 --max-eval-pairs 32 --log-every 1000 --save-every -1)
run() {  # name flags...
  local name=$1; shift
  case " $* " in *" --partition "*) ;; *) set -- "$@" --partition "${PP_PARTITION:-balanced}" ;; esac
  echo "== $name: mpirun -np 2 pp_train $*" | tee -a "$out/pp.log"
  # shellcheck disable=SC2086
  timeout ${PP_RUN_TIMEOUT:-75} mpirun -np 2 "$bin/pp_train" "${common[@]}" --out "$runs/$name" "$@" ${PP_EXTRA:-} \
    >>"$out/pp.log" 2>&1 || echo "!! $name failed (rc $?)" | tee -a "$out/pp.log"
}
fp32=(--epochs ${PP_EPOCHS:-2} --precision fp32 --batch-size 64 --seq-len 128 --max-train-pairs ${PP_FP32_PAIRS:-640})
bf16=(--epochs ${PP_EPOCHS:-2} --precision bf16 --batch-size 32 --seq-len 1024 --max-train-pairs ${PP_BF16_PAIRS:-320})
hw5=(--epochs ${PP_HW5_EPOCHS:-3} --precision fp32 --batch-size 96 --seq-len 128 --max-train-pairs ${PP_HW5_PAIRS:-960})
# Zero bubble (--zero-bubble: split backwards, W's in the bubbles) for 1F1B and interleaved.
zb_runs() {  # setting flags...
  local setting=$1; shift
  for m in ${PP_ZB_MS_1F1B-2 4 8}; do run ${setting}_1f1b-zb_m$m "$@" --schedule 1f1b --microbatches $m --zero-bubble; done
  for m in ${PP_ZB_MS_INTERLEAVED-4 8}; do
    run ${setting}_interleaved-zb_m$m "$@" --schedule interleaved --stages-per-rank 2 --microbatches $m --zero-bubble
  done
}
for setting in ${PP_SETTINGS-fp32 bf16}; do
  declare -n flags=$setting
  run ${setting}_mp "${flags[@]}" --mode model_parallel
  for m in ${PP_MS_1F1B:-2 4 8 16}; do run ${setting}_1f1b_m$m "${flags[@]}" --schedule 1f1b --microbatches $m; done
  for m in ${PP_MS_GPIPE:-4 8}; do run ${setting}_gpipe_m$m "${flags[@]}" --schedule gpipe --microbatches $m; done
  for m in ${PP_MS_INTERLEAVED:-2 4 8}; do
    run ${setting}_interleaved_m$m "${flags[@]}" --schedule interleaved --stages-per-rank 2 --microbatches $m
  done
  zb_runs $setting "${flags[@]}"
done
if [ "${PP_HW5:-1}" = 1 ]; then
  run hw5_mp "${hw5[@]}" --mode model_parallel
  for m in ${PP_HW5_MS:-2 4 8}; do run hw5_1f1b_m$m "${hw5[@]}" --schedule 1f1b --microbatches $m; done
  for m in ${PP_HW5_MS_INTERLEAVED:-2 4 8}; do
    run hw5_interleaved_m$m "${hw5[@]}" --schedule interleaved --stages-per-rank 2 --microbatches $m
  done
  [ "${PP_HW5_GPIPE:-1}" = 1 ] && run hw5_gpipe_m2 "${hw5[@]}" --schedule gpipe --microbatches 2
  zb_runs hw5 "${hw5[@]}"
fi
if [ "${PP_UNIFORM:-1}" = 1 ]; then
  run fp32_mp_uniform "${fp32[@]}" --mode model_parallel --partition uniform
  run fp32_1f1b_m8_uniform "${fp32[@]}" --schedule 1f1b --microbatches 8 --partition uniform
fi
SCHEDULES=${PP_ANCHOR_SCHEDULES:-gpipe:4,gpipe:8,onef1b:4,onef1b:8} PYTHONUNBUFFERED=1 \
  timeout ${PP_ANCHOR_TIMEOUT:-200} python3 "$anchors/pp_anchor.py" >"$out/pp_anchor.jsonl" 2>"$out/pp_anchor.err"
python3 scripts/device/bench_table.py pp "$runs" "$out/pp_anchor.jsonl" --json "$out/pp_summary.json" | tee "$out/pp_table.txt"
