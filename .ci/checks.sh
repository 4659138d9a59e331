#!/usr/bin/env bash
# Runs named checks one after another — every one, even after a failure — then prints a summary
# of all of them (ok/FAIL and time) and exits 1 if any failed. `make test` uses it:
#   .ci/checks.sh NAME COMMAND [NAME COMMAND]...
# COMMAND is one bash command line, run from the repository root.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ] || [ $(($# % 2)) -ne 0 ]; then
  echo "usage: $0 NAME COMMAND [NAME COMMAND]..." >&2
  exit 2
fi
total=$(($# / 2))
summary=()
failed=0
i=0
while [ $# -gt 0 ]; do
  name=$1 cmd=$2
  shift 2
  i=$((i + 1))
  echo "=== check $i/$total: $name: $cmd"
  start=$SECONDS
  if bash -o pipefail -c "$cmd"; then
    summary+=("ok    $name ($((SECONDS - start))s)")
  else
    summary+=("FAIL  $name ($((SECONDS - start))s, exit $?)")
    failed=$((failed + 1))
  fi
done
echo "=== summary: $((total - failed)) of $total checks passed"
printf '  %s\n' "${summary[@]}"
if [ "$failed" -gt 0 ]; then
  echo "=== $failed failed: scroll up to its '=== check' line for its output"
  exit 1
fi
