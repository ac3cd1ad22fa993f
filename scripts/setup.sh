#!/usr/bin/env bash
# Create .venv with the CPU build of torch and fxprop installed for development.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install --quiet torch==2.13.0
fi
.venv/bin/pip install --quiet -e '.[test,docs,plot]'  # plot: the live-bytes plot's tests run, not skip
