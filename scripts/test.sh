#!/usr/bin/env bash
# Set up (if needed) and run the test suite; exits non-zero when a test fails.
# Without arguments, the model, corpus and fuzz tests then run again with the cache in verify
# mode (every hit recomputed and compared).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
if [ $# -eq 0 ]; then
  verified=(tests/test_models.py tests/test_fuzz.py)
  [ -f tests/test_corpus.py ] && verified+=(tests/test_corpus.py)
  FXPROP_CACHE_VERIFY=1 .venv/bin/python -m pytest -q -p no:cacheprovider "${verified[@]}"
fi
