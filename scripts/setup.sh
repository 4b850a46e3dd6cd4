#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine: the Fashion-MNIST package
# (default dataset), the Python 3.11 documentation's sources (the thor_bert text corpus), Chromium
# and its WebDriver (tests/ui/test_viz_browser.py and test_browser.py open kedro-viz and the MLflow UI in it), PostgreSQL (the
# slow tier's database server), a C compiler (one slow test's preload library) and a virtual
# environment in .venv/ with the locked dependencies (installed by uv, below).
# Safe to rerun: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "Installing Debian package dataset-fashion-mnist"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist
fi

# The thor_bert pipeline pre-trains BERT on the prose of the Python 3.11 docs' reST sources (trainlib.text.corpus)
if [ ! -f /usr/share/doc/python3.11/html/_sources/library/index.rst.txt ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "Installing Debian package python3.11-doc (the thor_bert text corpus)"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11-doc
fi

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "Installing Debian packages chromium and chromium-driver (for the browser tests, tests/ui)"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
fi

# PostgreSQL, as a team runs it for its shared tuning storage and MLflow store: the slow tier's fixture
# (tests/support/postgres.py) starts a cluster of its own in a temporary folder, so the package's default cluster is
# not created
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "Installing Debian package postgresql (the slow tier's database server)"
  $sudo mkdir -p /etc/postgresql-common
  echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.conf >/dev/null
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
fi

# A C compiler: tests/e2e/test_thor_statistics_dtype.py builds tests/support/fake_nprocs.c, the preload that shows
# a process 2 or 4 cores (so oneDNN splits THOR's statistics differently)
if ! command -v cc >/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "Installing Debian package gcc (the THOR statistics test's preload library)"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev
fi

python=$(command -v python3.11 || command -v python3)
if [ ! -x .venv/bin/python ]; then
  echo "Creating .venv with $($python --version)"
  "$python" -m venv .venv
fi

# uv installs the lock: it downloads and unpacks in parallel and compiles the bytecode on every core (this script on a
# fresh clone, empty caches: 122 s with pip, 71 s with uv; docs/experiments/2026-11-25-test-suite-timings.md). The
# bytecode is compiled at install because nothing compiles it later where PYTHONDONTWRITEBYTECODE is set.
uv_install=(.venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode)
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install -q uv==0.13.9
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "Installing locked dependencies into .venv (mindspore is an 800 MB wheel)"
  "${uv_install[@]}" -r requirements.lock
  "${uv_install[@]}" --no-deps -e .
  touch "$stamp"
fi

# whether .venv has a package, found without importing it (importing torch alone takes 2-3 s, on every test command)
installed() {
  .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"
}

# The optional 'migrate' extra (PyTorch CPU): only the migrate pipeline and tests/test_migrate.py use it. Through pip:
# where the CPU build lies (an index or find-links) is pip's configuration, which uv does not read.
if ! installed torch; then
  echo "Installing the 'migrate' extra (PyTorch CPU: about 750 MB installed)"
  .venv/bin/python -m pip install -q -e ".[migrate]"
fi

# The optional 'notebook' extra (JupyterLab, about 80 MB installed): notebooks/compare_recipes.ipynb in JupyterLab.
if ! installed jupyterlab; then
  echo "Installing the 'notebook' extra (JupyterLab)"
  "${uv_install[@]}" -e ".[notebook]"
fi
