#!/usr/bin/env bash
# Why pp_train's split backward runs faster than the plain one in bf16 on one GPU
# (results/2026-12-01-h200-zero-bubble-memory/: 32 x 1024, M=2: 71 against 82 ms; 16 x 1024,
# M=1: 37.3 against 43.1 ms, all of it in the forward, 11.9 against 17.5 ms). PyTorch itself shows
# no such gap (linear_probe.py: GPT-2's blocks with the autocast linear and with deferred_linear's
# arithmetic both take 30 ms).
# SPLIT_PROBE_TORCH=1 runs linear_probe.py too. Then pp_train on one rank, M=1, for each
# precision x batch x (plain, --zero-bubble) x dropout: per-phase medians from the timing files.
# If the gap is host time (the plain forward records ~6 autograd nodes per linear under autocast,
# the split one 1), it stays about constant in ms as the batch grows; GPU work would grow with it.
# usage: split_probe.sh BUILD_DIR OUT_DIR    -> OUT_DIR/split_probe.txt, probe_*.log
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2; mkdir -p "$out"
gpt2p_device_data "$bin" "$out"
table=$out/split_probe.txt
if [ "${SPLIT_PROBE_TORCH:-0}" = 1 ]; then
  PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/linear_probe.py" --batch 16 --seq 1024 --dtype bf16 \
    >"$out/probe_torch_bf16.log" 2>&1 || echo "!! linear_probe.py bf16 failed" >>"$table"
fi
runs=()
for prec in ${SPLIT_PROBE_PRECISIONS:-bf16 fp32}; do
  for batch in ${SPLIT_PROBE_BATCHES:-8 16 32}; do
    for dropout in ${SPLIT_PROBE_DROPOUTS:-0.1 0}; do
      for zb in 0 1; do
        name=${prec}_b${batch}_d${dropout}_zb$zb
        flags=(); [ $zb = 1 ] && flags=(--zero-bubble)
        timeout 150 mpirun -np 1 "$bin/pp_train" --data "$data" --precision "$prec" --batch-size "$batch" \
          --seq-len 1024 --dropout "$dropout" --schedule 1f1b --microbatches 1 --epochs 1 --max-steps 20 \
          --max-train-pairs $((batch * 20)) --max-eval-pairs 32 --translate-samples 0 --save-every -1 \
          --log-every 1000 --out "$out/probe_runs/$name" "${flags[@]}" >"$out/probe_$name.log" 2>&1 ||
          echo "!! $name failed" >>"$table"
        runs+=("$name")
      done
    done
  done
done
"$GPT2P_PYTHON" - "$out/probe_runs" "${runs[@]}" >>"$table" <<'PY'
import sys, h5py, numpy as np
print(f"{'run':22s} {'step_ms':>8s} {'F_ms':>7s} {'B_ms':>7s} {'W_ms':>6s} {'opt_ms':>6s}")
for name in sys.argv[2:]:
    try:
        with h5py.File(f"{sys.argv[1]}/{name}/rank0.h5", "r") as f:
            st, ac = f["steps"], f["actions"]
            step = np.median((st["end"][:] - st["start"][:])[4:]) * 1e3
            op, d, s = ac["op"][:], (ac["end"][:] - ac["start"][:]) * 1e3, ac["step"][:]
            med = lambda o: float(np.median(d[(op == o) & (s >= 4)])) if ((op == o) & (s >= 4)).any() else 0.0
            print(f"{name:22s} {step:8.2f} {med(0):7.2f} {med(1):7.2f} {med(7):6.2f} {med(6):6.2f}")
    except Exception as e:  # noqa: BLE001 - one failed run must not hide the others
        print(f"{name}: {e}")
PY
grep -h "blocks fwd+bwd" "$out"/probe_torch_*.log >>"$table" 2>/dev/null
cat "$table"
