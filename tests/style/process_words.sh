#!/usr/bin/env bash
# The project's code, scripts, tests and results READMEs say what the software does and how each
# figure was measured (command, machine, commit, date), never how the project was made. This test
# fails on words that belong to the latter: it greps, case-insensitively, every file under the
# paths below for the pattern, drops the hits in the allowlist, prints the rest as file:line: text
# and exits 1 if any remain (0 if none).
# usage: tests/style/process_words.sh [REPO_ROOT]        (default: two folders above this script)
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2

# Each word is written with a bracket expression so that this line does not match itself.
pattern='[s]ession|[c]all [0-9]|[i]ssue [0-9]|[s]ame call|[o]ne-call|[d]evice time'

paths=()
for p in src include scripts jobs analysis tests README.md results/README.md results/*/README.md \
         CMakeLists.txt .ci; do
  [ -e "$p" ] && paths+=("$p")
done

# Allowed hits: "file<TAB>extended regex the line must match". The regexes are case-sensitive and
# use bracket expressions so that this file's own lines do not match the pattern above.
allow=$(cat <<'EOF'
scripts/faults	start_new_[s]ession=True
tests/badinput/run_cases.py	start_new_[s]ession=True
include/gpt2p/comm/cuda_check.h	makes the same [c]alls in the same order
tests/data/make_tokenizer_cases.py	"[C]all 555-1234 or
tests/data/tokenizer_cases.jsonl	"[C]all 555-1234 or
EOF
)
# What each entry is:
#   scripts/faults, tests/badinput/run_cases.py   Python's subprocess.Popen keyword that starts
#                                                 each job in its own process group
#   include/gpt2p/comm/cuda_check.h               the text of an error message: every rank must
#                                                 make the same collective operations in order
#   tests/data/*tokenizer_cases*                  a tokenizer test string (a phone number)

allowed() {  # allowed FILE TEXT
  local f re
  while IFS=$'\t' read -r f re; do
    [ "$f" = "$1" ] && printf '%s\n' "$2" | grep -qE -- "$re" && return 0
  done <<<"$allow"
  return 1
}

bad=0
while IFS= read -r hit; do
  file=${hit%%:*}; rest=${hit#*:}; text=${rest#*:}
  if ! allowed "$file" "$text"; then
    printf '%s\n' "$hit"
    bad=$((bad + 1))
  fi
done < <(grep -rnIiE --exclude-dir=__pycache__ --exclude-dir=.pytest_cache -- "$pattern" "${paths[@]}")

if [ "$bad" -gt 0 ]; then
  echo "process_words: $bad line(s) above speak of how the project was made, not of what it does" >&2
  exit 1
fi
echo "process_words: no process words in ${#paths[@]} paths"
exit 0
