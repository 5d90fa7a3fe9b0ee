#!/usr/bin/env bash
# The test suite: bash scripts/test.sh [pytest args]. Creates .venv first when torch is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec "$PY" -m pytest "${@:--q}" tests
