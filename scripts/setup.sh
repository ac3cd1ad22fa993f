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
# Byte-compile the package as a regular (non-editable) pip install does: an editable install
# leaves that to the first import, which never writes it where PYTHONDONTWRITEBYTECODE is set,
# and every fresh process then compiles fxprop's sources again (~0.1 s of a 0.15 s import).
.venv/bin/python -m compileall -q fxprop
