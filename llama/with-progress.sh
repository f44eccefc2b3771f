#!/usr/bin/env bash
# Runs a long, quiet build step (the llama-server build of `make llama`) with its output in a log
# and a line of progress every 30 s: the time so far against the time expected, and the build's
# own percentage when its log shows one (cmake's "[ 42%]"). On failure, the end of the log.
#
#   llama/with-progress.sh LOG EXPECTED_MINUTES WHAT -- COMMAND...
set -euo pipefail
log=$1 expected=$2 what=$3
shift 3
[[ ${1:-} == -- ]] && shift
mkdir -p "$(dirname "$log")"
echo "$what: about $expected min on 2 cores the first time (cached after); its output: $log"
started=$(date +%s)
"$@" >"$log" 2>&1 &
step=$!
trap 'kill "$step" 2>/dev/null; exit 130' INT TERM
while kill -0 "$step" 2>/dev/null; do
  for _ in 1 2 3 4 5 6; do  # 30 s, in steps that notice the end
    kill -0 "$step" 2>/dev/null || break 2
    sleep 5
  done
  minutes=$(( ($(date +%s) - started) / 60 ))
  percent=$(grep -aoE '\[ *[0-9]{1,3}%\]' "$log" | tail -n 1 | tr -dc '0-9' || true)
  echo "  $what: ${minutes} of about $expected min${percent:+, the build at ${percent}%}"
done
if ! wait "$step"; then
  echo "$what failed; the end of $log:"
  tail -n 40 "$log"
  exit 1
fi
echo "$what: done in $(( ($(date +%s) - started) / 60 )) min"
