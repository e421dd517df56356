#!/usr/bin/env bash
# A minute-long check that every pp_train mode runs on 2 GPUs before the benchmark spends time:
# model_parallel, GPipe M=4, 1F1B M=4 and interleaved 1F1B (2 stages per rank) M=4 for 6 steps
# (and 1F1B with the per-parameter AdamW, to compare with the fused one). Prints one line per run: its status and its last logged loss.
# usage: pp_smoke.sh BUILD_DIR OUT_DIR
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
bin=$1; out=$2
runs=$out/pp_smoke; mkdir -p "$runs"
gpt2p_device_data "$bin" "$out"
common=(--data "$data" --epochs 1 --max-steps 6 --batch-size 64 --seq-len 128 --max-train-pairs 640
        --translate-samples 0 --max-eval-pairs 32 --log-every 1 --save-every -1)
smoke() {  # name env flags...
  local name=$1 envs=$2; shift 2
  echo "== $name ($envs): mpirun -np 2 pp_train $*" >>"$out/pp_smoke.log"
  env $envs timeout 60 mpirun -np 2 -x GPT2P_FUSED_ADAMW "$bin/pp_train" "${common[@]}" \
    --out "$runs/$name" "$@" >"$runs/$name.log" 2>&1
  local rc=$?
  cat "$runs/$name.log" >>"$out/pp_smoke.log"
  echo "pp smoke $name: rc $rc, $(grep -oE 'loss [0-9.naif]+' "$runs/$name.log" | tail -1)"
}
smoke mp GPT2P_FUSED_ADAMW=1 --mode model_parallel
smoke gpipe_m4 GPT2P_FUSED_ADAMW=1 --schedule gpipe --microbatches 4
smoke 1f1b_m4 GPT2P_FUSED_ADAMW=1 --schedule 1f1b --microbatches 4
smoke 1f1b_m4_unfused GPT2P_FUSED_ADAMW=0 --schedule 1f1b --microbatches 4
smoke interleaved_m4 GPT2P_FUSED_ADAMW=1 --schedule interleaved --stages-per-rank 2 --microbatches 4
