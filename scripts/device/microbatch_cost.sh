#!/usr/bin/env bash
# What micro-batching alone costs, measured with the real executor on ONE GPU, against pp_plan's
# prediction: pp_train on 1 rank (one stage: the whole model) at M = 1, 2, 4, 8 and pp_plan
# --stages 1 for the same batch. With one stage there is no bubble, so the measured step over M is
# the per-micro-batch inefficiency the 2-GPU pipeline pays, and pp_plan's layer times should
# predict it (the step adds the optimizer and the data, the same at every M).
# usage: microbatch_cost.sh BUILD_DIR OUT_DIR     -> OUT_DIR/microbatch_cost.txt, mbcost_*.log
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2; mkdir -p "$out"
gpt2p_device_data "$bin" "$out"
table=$out/microbatch_cost.txt
printf '%-6s %4s %5s %12s %12s %9s\n' setting M rows measured_ms predicted_ms ratio >"$table"
# MBCOST_POSITIONS=all runs the head at every position (--loss-positions all); the default runs
# it at the data's targets.
positions=${MBCOST_POSITIONS:-targets}
for s in "hw5 fp32 96 128" "bf16 bf16 32 1024"; do
  read -r name prec batch seq <<<"$s"
  for m in 1 2 4 8; do
    run=$out/mbcost_runs/${name}_m$m
    timeout 120 mpirun -np 1 "$bin/pp_train" --data "$data" --precision "$prec" --batch-size "$batch" \
      --seq-len "$seq" --schedule 1f1b --microbatches "$m" --epochs 1 --max-steps 24 \
      --max-train-pairs $((batch * 24)) --max-eval-pairs 32 --translate-samples 0 --save-every -1 \
      --loss-positions "$positions" --log-every 1000 --out "$run" >"$out/mbcost_${name}_m$m.log" 2>&1 ||
      echo "!! $name M=$m failed" >>"$table"
  done
  # pp_plan reads the share of target positions from the same pairs (or times every position).
  fraction=(--max-train-pairs $((batch * 24))); [ "$positions" = all ] && fraction=(--loss-fraction 1)
  mpirun -np 1 "$bin/pp_plan" --stages 1 --precision "$prec" --batch-size "$batch" --seq-len "$seq" \
    --microbatches 1,2,4,8 --stages-per-rank 1 --reps 5 --data "$data" "${fraction[@]}" \
    --json-out "$out/mbcost_plan_$name.json" >"$out/mbcost_plan_$name.log" 2>&1
  for m in 1 2 4 8; do
    run=$out/mbcost_runs/${name}_m$m
    "$GPT2P_PYTHON" - "$run/rank0.h5" "$out/mbcost_plan_$name.json" "$name" "$m" "$batch" >>"$table" <<'PY'
import json, sys, h5py, numpy as np
h5, plan, name, m, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
with h5py.File(h5, "r") as f:
    st = f["steps"]
    t = (st["end"][:] - st["start"][:])[4:]  # after warm-up
measured = float(np.median(t)) * 1e3
pred = [p for p in json.load(open(plan))["predictions"] if p["microbatches"] == m and p["schedule"] in ("gpipe", "model_parallel")]
predicted = pred[0]["step_s"] * 1e3 if pred else float("nan")
print(f"{name:6s} {m:4d} {batch // m:5d} {measured:12.2f} {predicted:12.2f} {measured / predicted:9.3f}")
PY
  done
done
cat "$table"
