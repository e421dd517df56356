#!/usr/bin/env bash
# What splitting the backward costs by itself, on ONE GPU: pp_train on 1 rank (one stage, no
# bubble to fill) without --zero-bubble, with it (--zb-extra-live 0, the default: every W runs
# right after its B, the memory of the plain schedule) and with --zb-extra-live -1 (every W
# deferred to the end of the step: the most memory a waiting W can hold). The steps differ only
# by the deferred linears' own overhead. Then pp_plan --zero-bubble predicts the 2-rank
# pipelines from this GPU's layer times, at the base's memory and without a limit.
# usage: zb_cost.sh BUILD_DIR OUT_DIR     -> OUT_DIR/zb_cost.txt, zb_plan_*.txt/json, zbcost_*.log
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2; mkdir -p "$out"
gpt2p_device_data "$bin" "$out"
table=$out/zb_cost.txt
printf '%-6s %4s %5s %9s %9s %9s %7s %22s\n' setting M rows plain_ms zb_ms zbinf_ms zb/plain \
  'peak_GiB plain/zb/inf' >"$table"
for s in "hw5 fp32 96 128 1,4" "bf16 bf16 32 1024 2"; do
  read -r name prec batch seq ms_list <<<"$s"
  for m in ${ms_list//,/ }; do
    for zb in 0 1 inf; do
      run=$out/zbcost_runs/${name}_m${m}_zb$zb
      flags=(); [ $zb = 1 ] && flags=(--zero-bubble)
      [ $zb = inf ] && flags=(--zero-bubble --zb-extra-live -1)
      timeout 120 mpirun -np 1 "$bin/pp_train" --data "$data" --precision "$prec" --batch-size "$batch" \
        --seq-len "$seq" --schedule 1f1b --microbatches "$m" --epochs 1 --max-steps 24 \
        --max-train-pairs $((batch * 24)) --max-eval-pairs 32 --translate-samples 0 --save-every -1 \
        --log-every 1000 --out "$run" "${flags[@]}" >"$out/zbcost_${name}_m${m}_zb$zb.log" 2>&1 ||
        echo "!! $name M=$m zb=$zb failed" >>"$table"
    done
    r=$out/zbcost_runs/${name}_m${m}
    "$GPT2P_PYTHON" - "${r}_zb0/rank0.h5" "${r}_zb1/rank0.h5" "${r}_zbinf/rank0.h5" \
      "$name" "$m" "$batch" >>"$table" <<'PY'
import sys, h5py, numpy as np
def step(path):
    with h5py.File(path, "r") as f:
        st = f["steps"]
        return float(np.median((st["end"][:] - st["start"][:])[4:])) * 1e3, float(f.attrs.get("peak_memory_bytes", 0)) / 2**30
(a, pa), (b, pb), (c, pc) = (step(p) for p in sys.argv[1:4])
name, m, batch = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
print(f"{name:6s} {m:4d} {batch // m:5d} {a:9.2f} {b:9.2f} {c:9.2f} {b / a:7.3f} "
      f"{pa:8.1f} / {pb:4.1f} / {pc:4.1f}")
PY
  done
  # The 2-rank prediction with split backwards, from this GPU's layer times.
  mpirun -np 1 "$bin/pp_plan" --stages 2 --precision "$prec" --batch-size "$batch" --seq-len "$seq" \
    --microbatches 2,4,8 --stages-per-rank 1,2 --zero-bubble --zb-extra-live 0,-1 --link-gbs 250 --data "$data" \
    --json-out "$out/zb_plan_$name.json" >"$out/zb_plan_$name.txt" 2>&1
done
cat "$table"
for f in "$out"/zb_plan_*.txt; do echo "== $f"; grep -E "^balanced|fastest" "$f"; done
