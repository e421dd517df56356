# Shared by the jobs/*.sbatch scripts: the repository root, the results directory, dry runs, and
# the launch itself. Sourced after each script's editable block; not a job on its own.
#
#   DRY_RUN=1 sbatch-script ...   (or --dry-run as the first argument): print the resolved environment
#   and the launch line instead of loading modules, building and running.

# Slurm copies the batch script to a spool directory: find the repository from the submit dir.
GPT2P_ROOT=${GPT2P_ROOT:-${SLURM_SUBMIT_DIR:-$(pwd)}}
if [ ! -f "$GPT2P_ROOT/scripts/lib.sh" ]; then
  echo "job: $GPT2P_ROOT is not the gpt2-parallel repository: submit from the repository root" \
       "(cd gpt2-parallel && sbatch jobs/<script>) or set GPT2P_ROOT" >&2
  exit 1
fi
cd "$GPT2P_ROOT"
DRY_RUN=${DRY_RUN:-0}
JOB_ID=${SLURM_JOB_ID:-local-$(date +%Y%m%d-%H%M%S)}
RESULTS=${RESULTS:-$GPT2P_ROOT/results/$JOB_ID}

# Loads the modules named in MODULES (the editable block), unless this is a dry run.
job_environment() {
  if [ "$DRY_RUN" = 1 ]; then
    for m in $MODULES; do echo "module load $m"; done
  else
    if [ -n "$MODULES" ]; then
      command -v module >/dev/null 2>&1 || { echo "job: 'module' not found but MODULES='$MODULES'; clear MODULES on this cluster" >&2; exit 1; }
      module purge
      for m in $MODULES; do module load "$m"; done
    fi
    [ -n "${VENV:-}" ] && source "$VENV/bin/activate"
    mkdir -p "$RESULTS"
  fi
  # shellcheck source=../scripts/lib.sh
  source "$GPT2P_ROOT/scripts/lib.sh"
}

job_show() {
  echo "# job $JOB_ID on ${SLURM_JOB_NUM_NODES:-1} node(s) (${SLURM_JOB_NODELIST:-$(hostname)})"
  echo "GPT2P_ROOT=$GPT2P_ROOT"
  echo "RESULTS=$RESULTS"
  echo "BIN=$BIN"
  echo "MODULES=$MODULES"
  echo "NODES=${NODES:-1} RANKS_PER_NODE=${RANKS_PER_NODE:-} RANKS=${RANKS:-}"
  echo "GPT2P_PYTHON=${GPT2P_PYTHON:-}"
}

# Builds $BIN when its programs are missing (never in a dry run).
job_build() {
  [ "$DRY_RUN" = 1 ] && return 0
  [ -x "$BIN/dp_train" ] && [ -x "$BIN/pp_train" ] && return 0
  gpt2p_build "$BIN" -DGPT2P_BUILD_TESTS=OFF
}

# On clusters where the build is done once beforehand (jobs/bridges2_setup.sh), a job needs its
# programs and must not build them on GPU hours: fails with the fix when one is missing.
#   job_require_build PROGRAM...   (default: dp_train pp_train)
job_require_build() {
  [ "$DRY_RUN" = 1 ] && return 0
  local progs=("$@") p
  [ ${#progs[@]} -gt 0 ] || progs=(dp_train pp_train)
  for p in "${progs[@]}"; do
    [ -x "$BIN/$p" ] || { echo "job: $BIN/$p is missing: build once with jobs/bridges2_setup.sh" \
      "(on a login node or a CPU job), then resubmit" >&2; exit 2; }
  done
}

# Prints the launch line, then (unless a dry run) runs it with output teed into $RESULTS.
# Returns the command's exit status (75: the trainers stopped after committing a checkpoint).
# srun's ranks are signalled by Slurm itself (--signal=TERM@120). With LAUNCHER=mpirun the launch
# goes through gpt2p_launch (scripts/lib.sh): a SIGTERM/SIGINT of this shell (sbatch
# --signal=B:TERM@120) becomes SIGUSR1 to mpirun and to this node's ranks, and mpirun itself is kept
# from the signal, which it would answer by killing the ranks a second later.
job_launch() {
  echo "launch: $*"
  [ "$DRY_RUN" = 1 ] && return 0
  if [ "${LAUNCHER:-srun}" != mpirun ]; then
    "$@" 2>&1 | tee -a "$RESULTS/job.log"
    return "${PIPESTATUS[0]}"
  fi
  # shellcheck source=../scripts/lib.sh
  declare -F gpt2p_launch >/dev/null || source "$GPT2P_ROOT/scripts/lib.sh"
  local rc=0
  gpt2p_launch "$@" > >(tee -a "$RESULTS/job.log") 2>&1 || rc=$?
  return "$rc"
}

# "srun" or "mpirun": the launcher words for N ranks, RANKS_PER_NODE per node, one GPU each.
job_launcher() {
  local n=$1
  case "${LAUNCHER:-srun}" in
    srun) echo "srun --ntasks=$n --ntasks-per-node=${RANKS_PER_NODE:-$n} --cpu-bind=cores --mpi=${SRUN_MPI:-pmix}" ;;
    mpirun) echo "mpirun -np $n --map-by ppr:${RANKS_PER_NODE:-$n}:node --bind-to core" ;;
    *) echo "job: LAUNCHER='$LAUNCHER' is neither srun nor mpirun" >&2; return 1 ;;
  esac
}
