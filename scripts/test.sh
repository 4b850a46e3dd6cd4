#!/usr/bin/env bash
# Installs what is missing, then runs the test suite (arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec pytest "$@"
