#!/usr/bin/env bash
# One GPU's training speed beside the strongest PyTorch peer (compile_anchor.py: nanoGPT under
# torch.compile), in one go:
#   speed.sh BUILD_DIR OUT_DIR [MATRIX]     (MATRIX: default scripts/device/speed_matrix.tsv)
# Runs every matrix row (one rank, --max-steps SPEED_STEPS, default 30), then the anchor at every
# configuration the rows name, then writes OUT_DIR/speed_table.txt and speed.json
# (scripts/device/speed_table.py). SPEED_ROWS="name ..." runs only those rows; SPEED_ANCHOR=0
# skips the anchor; SPEED_PROFILE=name also writes a --profile trace of that row and its
# per-kernel table (analysis/kernel_table.py).
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2; matrix=${3:-scripts/device/speed_matrix.tsv}
runs=$out/speed_runs; mkdir -p "$runs"
anchors=.anchors; [ -d "$anchors" ] || anchors=../shared/anchors
gpt2p_device_data "$bin" "$out"
steps=${SPEED_STEPS:-30}
common=(--data "$data" --epochs 1 --max-steps "$steps" --max-train-pairs $((64 * steps))
        --save-every -1 --translate-samples 0 --max-eval-pairs 16 --log-every 10 --overwrite)
wanted() { [ -z "${SPEED_ROWS:-}" ] && return 0; [[ " $SPEED_ROWS " == *" $1 "* ]]; }
configs=()
while IFS=$'\t' read -r name anchor program flags; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  wanted "$name" || continue
  [ "$anchor" != - ] && [[ " ${configs[*]} " != *" $anchor "* ]] && configs+=("$anchor")
  extra=()
  [ "${SPEED_PROFILE:-}" = "$name" ] && extra=(--profile "$out/profile_$name")
  echo "== $name: $program $flags" | tee -a "$out/speed.log"
  # shellcheck disable=SC2086
  timeout 240 "$bin/$program" "${common[@]}" --out "$runs/$name" $flags "${extra[@]}" \
    >>"$out/speed.log" 2>&1 || echo "!! $name failed (rc $?)" | tee -a "$out/speed.log"
  echo "$name	$anchor" >>"$runs/rows.tsv"
done <"$matrix"
if [ -n "${SPEED_PROFILE:-}" ] && [ -f "$out/profile_$SPEED_PROFILE/trace_rank0.json" ]; then
  python3 analysis/kernel_table.py "$out/profile_$SPEED_PROFILE/trace_rank0.json" --steps 3 \
    --json "$out/kernels_$SPEED_PROFILE.json" >"$out/kernels_$SPEED_PROFILE.txt" 2>&1
fi
: >"$out/compile_anchor.jsonl"
if [ "${SPEED_ANCHOR:-1}" = 1 ]; then
  for c in "${configs[@]}"; do
    tf32=0; [[ "$c" == *+tf32 ]] && tf32=1
    CONFIGS=${c%+tf32} TF32=$tf32 PYTHONUNBUFFERED=1 timeout 300 python3 "$anchors/compile_anchor.py" 2>>"$out/compile_anchor.err" |
      python3 -c 'import json,sys; t=sys.argv[1]
for l in sys.stdin:
    d=json.loads(l); d["config"]=t; print(json.dumps(d))' "$c" >>"$out/compile_anchor.jsonl"
  done
fi
python3 scripts/device/speed_table.py "$runs" "$out/compile_anchor.jsonl" --json "$out/speed.json" | tee "$out/speed_table.txt"
