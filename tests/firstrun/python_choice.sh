#!/usr/bin/env bash
# First run on a fresh machine: scripts/lib.sh is sourced before scripts/setup has installed
# Debian's python3-h5py/-numpy/-matplotlib/-pytest, and the first python3 on PATH may be a
# pyenv/venv one without them. The scripts must choose their Python after setup, not when lib.sh
# is sourced. Both interpreters here are stand-ins for the real /usr/bin/python3:
#   $tmp/pyenv/python3   first on PATH, never has the packages (Python's -S: no site-packages)
#   $tmp/system/python3  GPT2P_SYSTEM_PYTHON: without them until "setup" creates $tmp/installed
# Exit 77 (skipped) when the real /usr/bin/python3 lacks the packages (scripts/setup not run).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
real=/usr/bin/python3
if ! "$real" -c 'import h5py, numpy, matplotlib, pytest' 2>/dev/null; then
  echo "SKIP: $real lacks h5py/numpy/matplotlib/pytest (run scripts/setup)"; exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/pyenv" "$tmp/system"
cat >"$tmp/pyenv/python3" <<STUB
#!/bin/sh
echo "pyenv \$*" >>"$tmp/calls.log"
exec $real -S "\$@"
STUB
cat >"$tmp/system/python3" <<STUB
#!/bin/sh
echo "system \$*" >>"$tmp/calls.log"
[ -e "$tmp/installed" ] && exec $real "\$@"
exec $real -S "\$@"
STUB
chmod +x "$tmp/pyenv/python3" "$tmp/system/python3"

fail=0
check() {  # check NAME COMMAND...: runs it, prints PASS/FAIL
  if "${@:2}"; then echo "PASS: $1"; else echo "FAIL: $1"; fail=1; fi
}

# The fresh machine's sequence, as in scripts/test and scripts/run: source lib.sh, run setup
# (here: the packages appear), then run Python through $GPT2P_PYTHON.
first_run() {
  env -u GPT2P_PYTHON PATH="$tmp/pyenv:$PATH" GPT2P_SYSTEM_PYTHON="$tmp/system/python3" \
    bash -c 'set -euo pipefail
      source "$1/scripts/lib.sh"
      echo "after-source $GPT2P_PYTHON" >>"$2/calls.log"
      touch "$2/installed"                     # scripts/setup installed python3-h5py & co.
      cd "$1"
      "$GPT2P_PYTHON" -m pytest --version >"$2/pytest.out" 2>&1
      "$GPT2P_PYTHON" -c "import h5py, numpy, matplotlib, sys; print(sys.argv[0])" >"$2/import.out" 2>&1
      gpt2p_python h5py numpy matplotlib pytest >"$2/chosen.out"' _ "$root" "$tmp"
}
first_run_rc=0
first_run >"$tmp/first_run.log" 2>&1 || first_run_rc=$?

nothing_probed_before_setup() {
  # Sourcing lib.sh must not run any Python: what it found then would be stale after setup.
  ! sed -n '/^after-source/q;p' "$tmp/calls.log" | grep -q . ||
    { echo "  lib.sh ran Python when sourced:"; sed -n '/^after-source/q;p' "$tmp/calls.log" | sed 's/^/    /'; false; }
}
pytest_runs_after_setup() {
  [ "$first_run_rc" = 0 ] && grep -q '^pytest ' "$tmp/pytest.out" ||
    { echo "  first run rc $first_run_rc:"; sed 's/^/    /' "$tmp/first_run.log" "$tmp/pytest.out" "$tmp/import.out" 2>/dev/null; false; }
}
system_python_chosen() {
  [ "$(cat "$tmp/chosen.out" 2>/dev/null)" = "$tmp/system/python3" ] ||
    { echo "  chose '$(cat "$tmp/chosen.out" 2>/dev/null)', expected $tmp/system/python3"; false; }
}
check "sourcing scripts/lib.sh probes no Python" nothing_probed_before_setup
check "\$GPT2P_PYTHON -m pytest works once setup installed the packages" pytest_runs_after_setup
check "the interpreter with the packages is chosen over the first python3 on PATH" system_python_chosen
# A venv or pyenv python3 that has the packages is used as it comes first.
first_on_path_wins() {
  [ "$(PATH="$tmp/system:$PATH" bash -c 'source "$1/scripts/lib.sh"; gpt2p_python' _ "$root")" = "$tmp/system/python3" ]
}
check "a python3 first on PATH with the packages is chosen" first_on_path_wins
# Set by hand, GPT2P_PYTHON is kept.
explicit_kept() {
  [ "$(GPT2P_PYTHON=/opt/py/bin/python3 bash -c 'source "$1/scripts/lib.sh"; echo "$GPT2P_PYTHON"' _ "$root")" = /opt/py/bin/python3 ]
}
check "GPT2P_PYTHON set by hand is kept" explicit_kept
exit "$fail"
