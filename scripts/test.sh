#!/usr/bin/env bash
# Installs what is missing, then runs the fast test tier: everything in-process, spread over the cores (minutes).
# `--all` then runs the slow tier too (kedro run processes, msrun, browsers, JupyterLab; what CI runs), one test
# at a time: its tests time real processes and share one recipe store. Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
if [ "${1:-}" = "--all" ]; then
  shift
  pytest -n auto --dist worksteal "$@"
  exec pytest -m slow -p no:xdist "$@"
fi
exec pytest -n auto --dist worksteal "$@"
