#!/usr/bin/env bash
# Installs what is missing, then runs the fast test tier: everything in-process, spread over the cores (minutes).
# `--all` then runs the slow tier too (kedro run processes, msrun, browsers, JupyterLab; what CI runs):
# - three slow tests at a time on the two cores (each starts processes and spends part of its time waiting on them,
#   on servers and on msrun's cluster; the tests of one shared set-up stay on one worker), the `large_memory` ones
#   (ResNet-50's rehearsals, 11-13 GB, mostly one core compiling THOR's graphs) first, one after the other on one
#   worker, while the other two run the rest (tests/README.md: 1,833 s against 2,298 s two at a time, 19.2 GB at the
#   peak);
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
  part -n auto --dist worksteal "$@"
  part -m "slow and not exclusive" -n 3 --dist loadgroup --no-loadscope-reorder "$@"
  part -m "slow and exclusive" -p no:xdist "$@"
  exit 0
fi
exec pytest -n auto --dist worksteal "$@"
