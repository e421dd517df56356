# Shared by scripts/test, scripts/run, scripts/bench, scripts/gpu-check and jobs/: configure + build
# in one place. Usage: source scripts/lib.sh; gpt2p_build <build-dir> [extra cmake args...]
GPT2P_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Paths under the repo hash relatively, so build dirs and clones share ccache hits. The default
# build type has -g, for which ccache also hashes the working directory unless told not to: a
# clone elsewhere then missed every object (its debug info names the first clone's paths instead).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$GPT2P_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export GPT2P_VOCAB_DIR=${GPT2P_VOCAB_DIR:-$GPT2P_ROOT/.cache/gpt2-vocab}

# True when FILE is a dataset this prepare_data writes: it starts with the checksum block that
# DatasetFile::open checks (src/data/dataset_seal.cpp). An older one is made again.
gpt2p_dataset_ok() {
  [ "$(head -c 16 "$1" 2>/dev/null)" = "gpt2p-dataset 1 " ]
}

# The tests' dataset: sets $data to the cached one where it is current, or makes one in DIR with
# BIN/prepare_data. Prints "FAIL: prepare_data" and its log's tail and returns 1 when that fails.
#   gpt2p_test_data BIN DIR
gpt2p_test_data() {
  data=$GPT2P_ROOT/.cache/data/ding-gpt2.h5
  gpt2p_dataset_ok "$data" && return 0
  data=$2/ding-gpt2.h5
  "$1/prepare_data" --out "$data" >"$2/prepare_data.log" 2>&1 && return 0
  echo "FAIL: prepare_data"; tail "$2/prepare_data.log"; return 1
}

# The start of a tests/jobs/ script: sets $bin (BIN made absolute), $root (the repository, then
# the working directory: the programs' defaults such as .cache/gpt2-vocab are relative to it),
# $tmp (a new folder, removed on exit after CLEANUP, a command the trap runs first) and $data
# (gpt2p_test_data). Returns 1 when BIN is no folder or the dataset cannot be made.
#   gpt2p_job_test_start BIN ['CLEANUP']
gpt2p_job_test_start() {
  bin=$(cd "$1" && pwd) || return 1
  root=$GPT2P_ROOT
  cd "$root" || return 1
  tmp=$(mktemp -d) || return 1
  # shellcheck disable=SC2064  # CLEANUP and the rm see $tmp when the trap runs
  trap "${2:+$2; }rm -rf \"\$tmp\"" EXIT
  gpt2p_test_data "$bin" "$tmp"
}

# The device scripts' dataset: sets $data, preparing it once with $1/prepare_data (log in $2).
gpt2p_device_data() {
  data=.cache/data/ding-gpt2.h5
  gpt2p_dataset_ok "$data" || "$1/prepare_data" --out "$data" >"$2/prepare_data.log" 2>&1
}

# True when PyTorch with CUDA and a GPU are here: then we build against PyTorch's libtorch.
gpt2p_has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 &&
    python3 -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
}

# Configures and builds DIR, printing on stderr what it builds, about how long that takes and its
# progress (one line updating on a terminal, else a line every tenth of the steps or every minute);
# the build's whole output goes to DIR/build.log. On a failure it prints the compiler's output (the
# failed steps, from that log) and the log's path, and returns non-zero.
#   gpt2p_build DIR [extra cmake args...]
#   GPT2P_TARGETS="a b"     build only those (default: everything, tests included)
#   GPT2P_JOBS=N            parallel jobs (default: nproc)
#   GPT2P_BUILD_VERBOSE=1   print the build's whole output instead of the progress
gpt2p_build() {
  local dir=$1; shift
  local args=(-G Ninja -DCMAKE_BUILD_TYPE=${GPT2P_BUILD_TYPE:-RelWithDebInfo})
  if gpt2p_has_gpu; then
    [ -d "$GPT2P_ROOT/.gpu-deps" ] && eval "$(bash "$GPT2P_ROOT/.gpu-deps/unpack")"
    args+=(-DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:-$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')}"
           -DBoost_USE_STATIC_LIBS=ON)
  fi
  command -v ninja >/dev/null 2>&1 || args=("${args[@]:2}")
  [ -f "$dir/CMakeCache.txt" ] || echo "build: configuring $dir (log: $dir.configure.log)" >&2
  cmake -S "$GPT2P_ROOT" -B "$dir" "${args[@]}" "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log" >&2; echo "build: configure failed (log: $dir.configure.log)" >&2; return 1; }
  local jobs=${GPT2P_JOBS:-$(nproc)} log=$dir/build.log rc=0 t0=$SECONDS
  local targets=() tflag=()
  read -r -a targets <<<"${GPT2P_TARGETS:-}"
  [ ${#targets[@]} = 0 ] || tflag=(--target "${targets[@]}")
  gpt2p_build_plan "$dir" "$jobs" "$log" ${targets[@]+"${targets[@]}"}
  # The build's exit status travels as the last line of its output: the pipeline's status is then
  # that of gpt2p_build_progress, with or without the caller's pipefail.
  { local r=0
    NINJA_STATUS="[%f/%t] " cmake --build "$dir" -j "$jobs" ${tflag[@]+"${tflag[@]}"} 2>&1 || r=$?
    echo "gpt2p-build-exit $r"; } | gpt2p_build_progress "$log" || rc=$?
  if [ "$rc" != 0 ]; then
    gpt2p_build_failure "$log"
    return "$rc"
  fi
  local warnings
  warnings=$(grep -c 'warning:' "$log" || true)
  [ "$warnings" = 0 ] || echo "build: $warnings warning(s): see $log" >&2
  [ $((SECONDS - t0)) -lt 5 ] || echo "build: done in $(gpt2p_duration $((SECONDS - t0)))" >&2
  return 0
}

# "build: <targets> in DIR: N steps, about A-B min on C cores" on stderr, from ninja's dry run
# (-n): each step costs what it took the last time (DIR/.ninja_log), else what such a step took in
# a cold build on 2 cores (no ccache hits): a torch translation unit of the libraries or programs
# 38 s, one of the tests 21 s, a torch-free one (the layers core, io, cli, data, pipeline/plan:
# tests/style/layers.sh) 4 s, the precompiled torch header 200 s, a link 3 s. That makes
# scripts/run's first build (99 steps) about 19 min there.
#   gpt2p_build_plan DIR JOBS LOG [target...]
gpt2p_build_plan() {
  local dir=$1 jobs=$2 log=$3; shift 3
  local what=${*:-everything (programs and tests)} cores plan
  cores=$(nproc); [ "$jobs" -lt "$cores" ] && cores=$jobs
  if [ ! -f "$dir/build.ninja" ] || ! command -v ninja >/dev/null 2>&1; then
    echo "build: $what in $dir with $jobs jobs (log: $log)" >&2
    return 0
  fi
  plan=$(ninja -C "$dir" -n "$@" 2>&1 |
    awk -v nlog="$dir/.ninja_log" '
      BEGIN { while ((getline l < nlog) > 0) { split(l, f, "\t"); if (f[4] != "") { t[f[4]] = (f[2] - f[1]) / 1000; known++ } } }
      /^ninja: error/ { bad = 1 }
      /^\[[0-9]+\/[0-9]+\]/ {
        n++; o = $NF
        if (o in t) s += t[o]
        else if (o ~ /\.gch$/) s += 200
        else if ($2 == "Linking") s += 3
        else if (o ~ /\/src\/(core|io|cli|data|pipeline\/plan)\//) s += 4
        else if (o ~ /^tests\//) s += 21
        else s += 38 }
      END { printf "%d %d %d\n", bad ? -1 : n, s, (known > 0) }')
  local steps secs seen
  read -r steps secs seen <<<"${plan:-0 0 0}"
  [ "$steps" != -1 ] || return 0  # ninja refused (an unknown target): the build says why
  if [ "$steps" = 0 ]; then
    echo "build: $what in $dir: up to date" >&2
    return 0
  fi
  local est=$((secs / cores)) range
  if [ "$est" -lt 90 ]; then
    range="about a minute or less"
  else
    range="about $((est * 7 / 600))-$(((est * 13 + 599) / 600)) min"  # +-30 %
  fi
  if [ "$seen" = 0 ]; then
    echo "build: first build of $what in $dir: $steps steps, $range on $cores cores" \
         "(much less where ccache already holds them; later builds take seconds to minutes)" >&2
  else
    echo "build: $what in $dir: $steps steps to do, $range on $cores cores" >&2
  fi
  echo "build: progress below; the whole output goes to $log" >&2
}

# Reads the build's output (ending with "gpt2p-build-exit RC"), writes it to LOG and prints the
# progress on stderr; returns RC.
#   gpt2p_build_progress LOG
gpt2p_build_progress() {
  local log=$1 line rc=1 tty=0 shown=-1 last=$SECONDS t0=$SECONDS n total pct width desc
  [ -t 2 ] && [ "${GPT2P_BUILD_VERBOSE:-0}" != 1 ] && tty=1
  width=${COLUMNS:-80}
  while IFS= read -r line; do
    case "$line" in  # the build's last line may lack its newline: the status then ends it
      *"gpt2p-build-exit "*)
        [ "$line" = "gpt2p-build-exit ${line##*gpt2p-build-exit }" ] || printf '%s\n' "${line%gpt2p-build-exit *}" >&3
        rc=${line##*gpt2p-build-exit }; continue ;;
    esac
    printf '%s\n' "$line" >&3
    if [ "${GPT2P_BUILD_VERBOSE:-0}" = 1 ]; then printf '%s\n' "$line" >&2; continue; fi
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]]; then      # ninja: [n/N] description
      n=${BASH_REMATCH[1]}; total=${BASH_REMATCH[2]}; desc=${BASH_REMATCH[3]}
      pct=$((total > 0 ? 100 * n / total : 100))
    elif [[ $line =~ ^\[\ *([0-9]+)%\]\ (.*)$ ]]; then          # make: [ p%] description
      pct=${BASH_REMATCH[1]}; n="$pct%"; total=""; desc=${BASH_REMATCH[2]}
    else
      continue
    fi
    if [ "$tty" = 1 ]; then
      # "Building CXX object CMakeFiles/gpt2p_core.dir/src/core/error.cpp.o": src/core/error.cpp
      case "$desc" in "Building "*" object "*) desc=${desc##* object }; desc=${desc#*.dir/}; desc=${desc%.o} ;; esac
      line="build: [$n${total:+/$total}] $(gpt2p_duration $((SECONDS - t0))) $desc"
      printf '\r\033[K%s' "${line:0:$((width - 1))}" >&2
      shown=1
    elif [ $((pct / 10)) -gt "$shown" ] || [ $((SECONDS - last)) -ge 60 ]; then
      echo "build: [$n${total:+/$total}] $(gpt2p_duration $((SECONDS - t0)))" >&2
      shown=$((pct / 10)); last=$SECONDS
    fi
  done 3>"$log"
  # The last progress line stays.
  [ "$tty" = 0 ] || [ "$shown" = -1 ] || printf '\n' >&2
  return "$rc"
}

# The compiler's output of a failed build on stderr: ninja's failed steps (each "FAILED: <file>"
# and what the compiler said, without the long command line, which stays in the log), else the
# log's end; then the log's path.
gpt2p_build_failure() {
  local log=$1 max=40 excerpt
  if grep -q '^FAILED: ' "$log"; then
    excerpt=$(awk '/^FAILED: / { f = 1; print; getline; next }
                   f && !/^\[[0-9]+\/[0-9]+\] / { print }' "$log")
  else
    excerpt=$(tail -n "$max" "$log")
  fi
  echo "build: failed; the failing step's output:" >&2
  sed -n "1,${max}s/^/  /p" <<<"$excerpt" >&2
  [ "$(wc -l <<<"$excerpt")" -le "$max" ] || echo "  ..." >&2
  echo "build: the whole output is in $log" >&2
}

# "42 s", "3 min 5 s"
gpt2p_duration() {
  if [ "$1" -lt 60 ]; then echo "$1 s"; else echo "$(($1 / 60)) min $(($1 % 60)) s"; fi
}

# The python3 that has the analysis dependencies (h5py, numpy, matplotlib, pytest): the first on
# PATH may be a pyenv/venv one without them, while Debian's python3-* packages live in
# $GPT2P_SYSTEM_PYTHON (/usr/bin/python3). Looks at what is installed when it is called, so call it
# after scripts/setup: a fresh machine gets those packages only then.
#   gpt2p_python [module...]   prints the interpreter that has the modules (default: h5py numpy
#                              matplotlib); non-zero, with a hint on stderr, when none has them
gpt2p_python() {
  local mods=("$@") py path
  [ ${#mods[@]} -gt 0 ] || mods=(h5py numpy matplotlib)
  for py in python3 "${GPT2P_SYSTEM_PYTHON:-/usr/bin/python3}"; do
    path=$(command -v "$py" 2>/dev/null) || continue
    # find_spec locates a module without importing it: a few milliseconds per interpreter.
    if "$path" -c 'import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' "${mods[@]}" 2>/dev/null; then
      echo "$path"; return 0
    fi
  done
  echo "gpt2p: neither python3 on PATH nor ${GPT2P_SYSTEM_PYTHON:-/usr/bin/python3} has ${mods[*]};" \
       "scripts/setup installs them (Debian: python3-h5py python3-numpy python3-matplotlib" \
       "python3-pytest), or set GPT2P_PYTHON" >&2
  command -v python3 2>/dev/null || echo python3
  return 1
}
# What the scripts run Python with. Nothing is probed here (this file is sourced before
# scripts/setup has installed anything): scripts/python picks the interpreter each time it runs.
# Set GPT2P_PYTHON to use a particular one.
export GPT2P_PYTHON=${GPT2P_PYTHON:-$GPT2P_ROOT/scripts/python}

# Launching trainers so that a stop is never lost (scripts/launch, scripts/run, jobs/lib.sh).
#   gpt2p_launch mpirun -np N build/dp_train ... [--out DIR]
# Runs the launch line under setsid, without a controlling terminal, so a Ctrl-C at the terminal reaches this shell and
# not mpirun: Open MPI's mpirun answers a SIGINT/SIGTERM of its own by killing its ranks about a
# second later (odls_base_sigkill_timeout) and exits 1 whatever they returned. Here the first
# SIGINT/SIGTERM/SIGHUP/SIGUSR1 becomes SIGUSR1 to mpirun (which passes it on to the ranks of other nodes,
# where the build forwards it) and to the ranks of this host, which then finish their step, commit a
# checkpoint and exit 75. A third signal ends the job through mpirun at once (no checkpoint).
# Returns the launch's exit status; 75 also when mpirun exited otherwise but rank 0 wrote
# <out>/stopped.json during this launch (mpirun itself was signalled, e.g. by a scheduler, and
# odls_base_sigkill_timeout gave the ranks the time to commit).
gpt2p_launch() {
  local out stamp pid rc=0
  out=$(gpt2p_launch_out "$@")
  stamp=$(mktemp "${TMPDIR:-/tmp}/gpt2p-launch.XXXXXX") || return 1
  # Ranks read nothing from the terminal; without one they must not try.
  setsid "$@" </dev/null &
  pid=$!
  GPT2P_LAUNCH_SIGNALS=0
  # shellcheck disable=SC2064
  trap "gpt2p_launch_signal $pid" INT TERM HUP USR1
  # A trapped signal ends `wait` early: wait again until the launch itself has ended.
  wait "$pid" || rc=$?
  while kill -0 "$pid" 2>/dev/null; do rc=0; wait "$pid" || rc=$?; done
  trap - INT TERM HUP USR1
  if [ "$rc" != 0 ] && [ "$rc" != 75 ] && [ -n "$out" ] && [ "$out/stopped.json" -nt "$stamp" ]; then
    echo "launch: the ranks stopped cleanly and committed a checkpoint ($out/stopped.json), then" \
         "mpirun exited $rc: exit 75" >&2
    rc=75
  fi
  rm -f "$stamp"
  return "$rc"
}

# The --out of a trainer's launch line, or its default runs/<program>; empty when neither is there.
gpt2p_launch_out() {
  local a prev="" prog=""
  for a in "$@"; do
    case "$prev" in --out) echo "$a"; return 0 ;; esac
    case "$a" in
      --out=*) echo "${a#--out=}"; return 0 ;;
      */dp_train | dp_train | */pp_train | pp_train | */gpt2_train | gpt2_train) prog=${a##*/} ;;
    esac
    prev=$a
  done
  [ -n "$prog" ] && echo "runs/$prog"
  return 0
}

# One signal to a launch (gpt2p_launch): the first two become SIGUSR1 (a second is harmless: the
# trainers take it as the same request), the third SIGTERM to mpirun.
gpt2p_launch_signal() {
  GPT2P_LAUNCH_SIGNALS=$((GPT2P_LAUNCH_SIGNALS + 1))
  if [ "$GPT2P_LAUNCH_SIGNALS" -ge 3 ]; then
    echo "launch: third signal: ending the job now, without a checkpoint" >&2
    kill -TERM "$1" 2>/dev/null
    return 0
  fi
  [ "$GPT2P_LAUNCH_SIGNALS" = 1 ] &&
    echo "launch: stopping: the ranks finish their step, commit a checkpoint and exit 75" \
         "(a third Ctrl-C ends the job at once, without one)" >&2
  gpt2p_stop_ranks "$1"
}

# SIGUSR1 to the launcher process $1 and to the MPI ranks among its descendants (this host's): never
# to its other descendants, such as a log's tee, which a process substitution makes a child of
# mpirun and which SIGUSR1 would end.
gpt2p_stop_ranks() {
  local p queue=("$1")
  kill -USR1 "$1" 2>/dev/null
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    # A process without children makes pgrep fail: that must not end a caller under `set -e`
    # (a job script), from inside its signal trap.
    # shellcheck disable=SC2207
    queue+=($(pgrep -P "$p" || true))
    [ "$p" = "$1" ] && continue
    grep -qzE '^(OMPI_COMM_WORLD_RANK|PMI_RANK|PMIX_RANK)=' "/proc/$p/environ" 2>/dev/null &&
      kill -USR1 "$p" 2>/dev/null
  done
  return 0
}
