#!/usr/bin/env bash
# A/B of compat::AutocastCacheScope (one bf16 cast of each weight per step instead of one per
# micro-batch) on one GPU: GPT2P_AUTOCAST_CACHE=0 turns it off. Prints the median step and the
# median forward/backward per run (epochs after the first).
# usage: autocast_ab.sh BUILD_DIR OUT_DIR
set -uo pipefail
source "$(dirname "$0")/../lib.sh"  # mpirun as root, NCCL settings
bin=$1; out=$2
runs=$out/autocast_runs; mkdir -p "$runs"
data=.cache/data/ding-gpt2.h5
[ -s "$data" ] || "$bin/prepare_data" --out "$data" >"$out/prepare_data.log" 2>&1
common=(--data "$data" --epochs 2 --precision bf16 --seq-len 1024 --max-train-pairs 320
        --translate-samples 0 --max-eval-pairs 16 --log-every 1000 --save-every -1)
# AB_ORDER="1 0" runs the cached ones first; AB_MS picks the pipeline's micro-batch counts.
for cache in ${AB_ORDER:-0 1}; do
  for m in ${AB_MS:-4 8}; do
    GPT2P_AUTOCAST_CACHE=$cache timeout 90 mpirun -np 1 -x GPT2P_AUTOCAST_CACHE "$bin/pp_train" "${common[@]}" \
      --batch-size 32 --schedule 1f1b --microbatches $m --out "$runs/pp_m${m}_cache$cache" >>"$out/autocast.log" 2>&1
  done
  GPT2P_AUTOCAST_CACHE=$cache timeout 90 mpirun -np 1 -x GPT2P_AUTOCAST_CACHE "$bin/dp_train" "${common[@]}" \
    --batch-size 16 --grad-accum 4 --out "$runs/dp_accum4_cache$cache" >>"$out/autocast.log" 2>&1
done
python3 - "$runs" <<'PY'
import sys, pathlib, h5py, numpy as np
print(f"{'run':24s} {'step ms':>8s} {'fwd ms':>7s} {'bwd ms':>7s}")
for d in sorted(pathlib.Path(sys.argv[1]).iterdir()):
    with h5py.File(d / "rank0.h5", "r") as f:
        s = f["steps"]; m = s["epoch"][...] >= 1
        med = lambda a: 1e3 * float(np.median(a[m]))
        print(f"{d.name:24s} {med(s['end'][...] - s['start'][...]):8.1f} {med(s['forward'][...]):7.1f} {med(s['backward'][...]):7.1f}")
PY
