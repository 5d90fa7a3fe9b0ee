#!/usr/bin/env bash
# The test suite: bash scripts/test.sh [--quick] [pytest args]: ruff check . first, then pytest.
# Creates .venv first when torch is missing. --quick: the quick tier (tests/conftest.py QUICK: a test
# or two per module).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
if "$PY" -c "import ruff" 2>/dev/null; then  # the project's lint rules (pyproject.toml)
  "$PY" -m ruff check --quiet . || exit 1
else
  echo "note: ruff is not installed in $PY (pip install ruff): the lint check is skipped" >&2
fi
if [ "${1:-}" = --quick ]; then
  shift
  exec "$PY" -m pytest -m quick "${@:--q}" tests
fi
exec "$PY" -m pytest "${@:--q}" tests
