#!/usr/bin/env bash
# A stopped run is continued by the command its stop line prints, and nothing else is touched;
# checked for dp_train (2 ranks) and for pp_train (a 2-stage pipeline), each with non-default
# settings (--epochs, --lr, --seed; pp_train also --schedule, --microbatches) and its own --out:
#   1. stopped by Ctrl-C (SIGINT to the launch's process group) after a couple of steps, it exits
#      75, its checkpoint's root file is there (dp_train's meta.json, pp_train's manifest.json)
#      and it prints "continue with: mpirun -np 2 <program> --resume <out>/checkpoint"; that
#      command, run as printed from another directory, continues the same run: its settings (no
#      "note: resuming with" differences; config.ini holds the non-default ones), its --out (both
#      rank files there grow, a second segment in rank0.h5), "resumed from ... after step N", to
#      the end of the original --epochs;
#   2. a resume into a folder that holds another run (a one-step dp_train run, for both programs)
#      is refused (exit 2) and leaves it as it was;
#   3. --resume given the run's folder instead of its checkpoint: "did you mean";
#   4. the finished run's last line names its folder and files, and its analysis command runs.
#   tests/jobs/resume_command.sh BIN_DIR
set -uo pipefail
# shellcheck source=../../scripts/lib.sh
source "$(dirname "$0")/../../scripts/lib.sh"
# shellcheck disable=SC2016  # $tmp expands when the exit trap runs
gpt2p_job_test_start "$1" 'pkill -9 -f "$tmp/" 2>/dev/null' || exit 1
common=(--preset tiny --device cpu --max-train-pairs 64 --max-eval-pairs 16 --batch-size 16
        --seq-len 32 --data "$data" --log-every 1 --translate-samples 0 --save-every 1)
set -m
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# The rank file holds both runs: a /segments table, a row per run (analysis/reader.py).
two_segments() {
  "$(gpt2p_python)" - "$1" <<'PY'
import sys, h5py
f = h5py.File(sys.argv[1], "r")
seg = f["segments"]
sys.exit(0 if len(seg[next(iter(seg))]) == 2 else 1)
PY
}

# Each "--flag value" of the settings as config.ini's "flag = value" line.
config_holds() {
  local ini=$1; shift
  while [ $# -ge 2 ]; do
    grep -qx -- "${1#--} = $2" "$ini" || { echo "config.ini lacks '${1#--} = $2'"; return 1; }
    shift 2
  done
}

# What a folder's files hold, its lock aside.
files_of() { find "$1" -type f ! -name run.lock -exec md5sum {} + 2>/dev/null | sort | md5sum; }

# The sizes of a run folder's rank files, and whether each grew from BEFORE to AFTER.
rank_sizes() { stat -c %s "$1/rank0.h5" "$1/rank1.h5" 2>/dev/null | paste -sd' '; }
grew() {
  local -a before after
  read -r -a before <<<"$1"; read -r -a after <<<"$2"
  [ "${#after[@]}" = 2 ] && [ "${after[0]}" -gt "${before[0]}" ] &&
    [ "${after[1]}" -gt "${before[1]}" ]
}

# Checks 1-4 for one program; its files under $tmp/PROG. OTHER is another run's folder, made by
# PROG (a one-step run) unless it is there already.
#   check_resume PROG CHECKPOINT_ROOT_FILE OTHER SETTINGS...   (SETTINGS: "--flag value" pairs)
check_resume() {
  local prog=$1 root_file=$2 b=$3; shift 3
  local settings=("$@") dir=$tmp/$prog
  mkdir -p "$dir"
  local a=$dir/a flags=("${common[@]}" "${settings[@]}")

  # 1. Stop, then the printed command.
  "$root/scripts/launch" mpirun --oversubscribe -np 2 "$bin/$prog" "${flags[@]}" \
    --out "$a" >"$dir/a.log" 2>&1 &
  local pid=$! rc cmd words
  for _ in $(seq 600); do grep -q "step 2/" "$dir/a.log" 2>/dev/null && break; sleep 0.1; done
  kill -INT -- "-$pid"
  wait "$pid"; rc=$?
  cmd=$(sed -n 's/.*stopped by signal .* continue with: //p' "$dir/a.log" | tail -1)
  if [ "$rc" != 75 ] || [ -z "$cmd" ] || [ ! -f "$a/checkpoint/$root_file" ]; then
    bad "$prog stop: exit $rc, stop line: '$cmd', in checkpoint/:" \
      "$(find "$a/checkpoint" -mindepth 1 -maxdepth 1 -printf '%f ' 2>&1)"
    tail -5 "$dir/a.log"; return
  fi
  ok "$prog stop: exit 75, checkpoint/$root_file, the stop line says: $cmd"
  read -r -a words <<<"$cmd"
  [ "${words[0]}" = mpirun ] && [ "${words[3]}" = "$bin/$prog" ] && [ "${words[4]}" = --resume ] ||
    bad "the command is not 'mpirun -np N $bin/$prog --resume DIR': $cmd"
  local size_before size_after why
  size_before=$(rank_sizes "$a")
  # As printed, from another directory, with --oversubscribe for this 2-core machine.
  (cd "$tmp" && mpirun --oversubscribe "${words[@]:1}") >"$dir/a2.log" 2>&1
  rc=$?
  size_after=$(rank_sizes "$a")
  if [ "$rc" = 0 ] && grep -q "^resumed from $a/checkpoint after step [0-9]* .*writing to $a$" \
    "$dir/a2.log" && grep -q "epoch 3/3 step 4/4" "$dir/a2.log" &&
    ! grep -q "note: resuming with" "$dir/a2.log" && grew "$size_before" "$size_after" &&
    why=$(config_holds "$a/config.ini" "${settings[@]}"); then
    ok "$prog resume: the printed command continued the run in $a with ${settings[*]} to epoch 3/3"
  else
    bad "$prog resume: exit $rc; rank0.h5, rank1.h5: $size_before -> $size_after bytes;" \
      "${why:-}; log:"
    tail -8 "$dir/a2.log"
  fi
  if two_segments "$a/rank0.h5"; then
    ok "$prog rank0.h5: the resumed run's rows follow the stopped run's (2 segments)"
  else
    bad "$prog rank0.h5: no second segment"
  fi

  # 4. The last line of the finished run: where the results are, and a command that reads them.
  local last plot_cmd plot_words
  last=$(tail -1 "$dir/a2.log")
  plot_cmd=$(sed -n "s/^$prog: finished after step [0-9]*; results in .*; plots and metrics: python3 \(.*\) (from the source tree: scripts\/python)$/\1/p" <<<"$last")
  if [[ "$last" == "$prog: finished after step "*"; results in $a: 2 timing files rank<r>.h5, config.ini"*"checkpoint/;"* ]] &&
    [ -n "$plot_cmd" ]; then
    read -r -a plot_words <<<"$plot_cmd"
    if "$(gpt2p_python)" "${plot_words[@]}" >"$dir/plots.log" 2>&1 &&
      [ -s "$a/analysis/summary.json" ]; then
      ok "$prog finished line: names $a and its files; its command wrote $a/analysis/summary.json"
    else
      bad "$prog: the finished line's command failed: $plot_cmd"; tail -4 "$dir/plots.log"
    fi
  else
    bad "$prog: the finished run's last line: $last"
  fi

  # 2. Another run's folder.
  [ -d "$b" ] || mpirun --oversubscribe -np 2 "$bin/$prog" "${flags[@]}" --max-steps 1 --out "$b" \
    >"$dir/b.log" 2>&1 || { bad "$prog run $b failed"; tail -5 "$dir/b.log"; }
  local sum_b
  sum_b=$(files_of "$b")
  mpirun --oversubscribe -np 2 "$bin/$prog" --resume "$a/checkpoint" --out "$b" \
    >"$dir/into-b.log" 2>&1
  rc=$?
  if [ "$rc" = 2 ] && grep -q -- "--out $b holds another run" "$dir/into-b.log" &&
    [ "$(files_of "$b")" = "$sum_b" ]; then
    ok "$prog into another run: refused with exit 2, $b unchanged"
  else
    bad "$prog into another run: exit $rc; log:"
    grep -m1 "error:" "$dir/into-b.log" || tail -4 "$dir/into-b.log"
  fi

  # 3. The run's folder for its checkpoint.
  mpirun --oversubscribe -np 2 "$bin/$prog" --resume "$a" --out "$dir/c" --data "$data" \
    >"$dir/folder.log" 2>&1
  rc=$?
  if [ "$rc" = 2 ] && grep -q -- "did you mean --resume $a/checkpoint?" "$dir/folder.log"; then
    ok "$prog run folder: exit 2, did you mean --resume $a/checkpoint"
  else
    bad "$prog run folder: exit $rc; log:"
    grep -m1 "error:" "$dir/folder.log" || tail -4 "$dir/folder.log"
  fi
}

run_settings=(--epochs 3 --lr 0.0003 --seed 7)
# pp_train's other run is dp_train's one-step run: a run of its own would add some 10 s.
check_resume dp_train meta.json "$tmp/other" "${run_settings[@]}"
check_resume pp_train manifest.json "$tmp/other" "${run_settings[@]}" --schedule gpipe \
  --microbatches 2
exit "$fail"
