#!/usr/bin/env bash
# Set up (if needed) and run the test suite; exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
