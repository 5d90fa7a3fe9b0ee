#!/usr/bin/env bash
# The test suite: bash scripts/test.sh [--quick] [pytest args]. Creates .venv first when torch is
# missing. --quick: the quick tier (tests/conftest.py QUICK: every module, under a minute).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
if [ "${1:-}" = --quick ]; then
  shift
  exec "$PY" -m pytest -m quick "${@:--q}" tests
fi
exec "$PY" -m pytest "${@:--q}" tests
