#!/usr/bin/env bash
# Set up (if needed) and propagate the built-in transformer and CNN, printing every annotated node.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m fxprop demo "$@"
