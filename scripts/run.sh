#!/usr/bin/env bash
# Installs what is missing, then runs `kedro run` with the given arguments
# (default: the data + baseline pipelines on CPU with Fashion-MNIST).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"  # msrun starts the bare `python`
exec kedro run "$@"
