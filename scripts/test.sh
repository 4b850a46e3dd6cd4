#!/usr/bin/env bash
# Installs what is missing, then runs the fast test tier: everything in-process, spread over the cores (minutes).
# `--all` then runs the slow tier too (kedro run processes, msrun, browsers, JupyterLab; what CI runs):
# - the tests marked `large_memory` (ResNet-50's rehearsals, 11-13 GB, mostly one core compiling THOR's graphs),
#   one at a time, beside the fast tier on one worker (about 6 GB): together they fill the two cores;
# - then two slow tests at a time (each starts processes that use the two cores and a few GB; the tests of one
#   shared set-up stay on one worker);
# - then the tests marked `exclusive` (signal timing), one at a time.
# Other arguments go to pytest; the 15 slowest tests of each part are listed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

# pytest, where "no test selected" (status 5: the arguments pick none of this part) is not a failure
part() {
  local status=0
  pytest --durations=15 "$@" || status=$?
  [ "$status" -eq 0 ] || [ "$status" -eq 5 ] || exit "$status"
}

if [ "${1:-}" = "--all" ]; then
  shift
  large_memory_log=$(mktemp)
  part -m "slow and large_memory" -p no:xdist "$@" >"$large_memory_log" 2>&1 &
  large_memory=$!
  fast_status=0
  (part -n 1 "$@") || fast_status=$?
  large_memory_status=0
  wait "$large_memory" || large_memory_status=$?
  echo "--- the large_memory tests, run beside the fast tier ---"
  cat "$large_memory_log"
  rm -f "$large_memory_log"
  [ "$fast_status" -eq 0 ] || exit "$fast_status"
  [ "$large_memory_status" -eq 0 ] || exit "$large_memory_status"
  part -m "slow and not large_memory and not exclusive" -n 2 --dist loadgroup "$@"
  part -m "slow and exclusive" -p no:xdist "$@"
  exit 0
fi
exec pytest -n auto --dist worksteal "$@"
