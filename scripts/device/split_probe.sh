#!/usr/bin/env bash
# Why pp_train's split backward runs faster than the plain one in bf16 on one GPU (session 6 and 7:
# 32 x 1024, M=2: 71 against 82 ms). linear_probe.py times GPT-2's blocks with the plain autocast
# linear and with deferred_linear's arithmetic in PyTorch, and profiles both; then our programs at
# 16 x 1024 bf16 on one rank: pp_train M=1 with and without --zero-bubble, and dp_train.
# usage: split_probe.sh BUILD_DIR OUT_DIR    -> OUT_DIR/split_probe.txt, probe_*.log
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2; mkdir -p "$out"
gpt2p_device_data "$bin" "$out"
table=$out/split_probe.txt
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/linear_probe.py" --batch 16 --seq 1024 --dtype bf16 \
  >"$out/probe_torch_bf16.log" 2>&1 || echo "!! linear_probe.py bf16 failed" >>"$table"
PYTHONUNBUFFERED=1 python3 "$(dirname "$0")/linear_probe.py" --batch 96 --seq 128 --dtype fp32 \
  >"$out/probe_torch_fp32.log" 2>&1 || echo "!! linear_probe.py fp32 failed" >>"$table"
common=(--data "$data" --precision bf16 --batch-size 16 --seq-len 1024 --epochs 1 --max-steps 30
        --max-train-pairs 480 --max-eval-pairs 32 --translate-samples 0 --save-every -1 --log-every 1000)
timeout 150 mpirun -np 1 "$bin/pp_train" "${common[@]}" --schedule 1f1b --microbatches 1 \
  --out "$out/probe_runs/pp_plain" >"$out/probe_pp_plain.log" 2>&1 || echo "!! pp plain failed" >>"$table"
timeout 150 mpirun -np 1 "$bin/pp_train" "${common[@]}" --schedule 1f1b --microbatches 1 --zero-bubble \
  --out "$out/probe_runs/pp_zb" >"$out/probe_pp_zb.log" 2>&1 || echo "!! pp zb failed" >>"$table"
timeout 150 mpirun -np 1 "$bin/dp_train" "${common[@]}" \
  --out "$out/probe_runs/dp" >"$out/probe_dp.log" 2>&1 || echo "!! dp failed" >>"$table"
"$GPT2P_PYTHON" - "$out/probe_runs" >>"$table" <<'PY'
import sys, h5py, numpy as np
for name in ("pp_plain", "pp_zb", "dp"):
    try:
        with h5py.File(f"{sys.argv[1]}/{name}/rank0.h5", "r") as f:
            st = f["steps"]
            ms = np.median((st["end"][:] - st["start"][:])[4:]) * 1e3
            print(f"ours {name:9s} 16 x 1024 bf16, 1 rank: median step {ms:7.2f} ms, "
                  f"peak {f.attrs.get('peak_memory_bytes', 0) / 2**30:.1f} GiB")
    except Exception as e:  # noqa: BLE001 - one failed run must not hide the others
        print(f"ours {name}: {e}")
PY
grep -h "blocks fwd+bwd\|GEMM dW\|^torch" "$out"/probe_torch_*.log >>"$table"
cat "$table"
