# Sourced by train.sh and scripts/test.sh: sets PY to the Python that runs the app.
# The active Python is used as it is when it imports torch (an Ascend environment with torch_npu,
# say); otherwise .venv, created on first use with the pinned torch (requirements.txt) and this
# package with its test extra (pip install -e '.[test]').
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
has_torch() {  # finds the package without importing it (an import takes seconds)
  "$1" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null
}
PY=""
for candidate in python python3; do
  if command -v "$candidate" >/dev/null && has_torch "$candidate"; then
    PY="$(command -v "$candidate")"
    break
  fi
done
if [ -z "$PY" ]; then
  PY="$ROOT/.venv/bin/python"
  if ! has_torch "$PY"; then
    echo "Setting up $ROOT/.venv (first run: a few minutes)..." >&2
    python3 -m venv "$ROOT/.venv"
    "$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt" -e "$ROOT[test]" >&2
  fi
fi
# the checkout's package, also where it is not pip-installed (an Ascend environment, say)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! missing=$("$PY" - <<'PYCODE'
import importlib.util
need = ["torchvision", "yaml", "tensorboard", "sklearn", "PIL", "simplejpeg"]
gone = [m for m in need if importlib.util.find_spec(m) is None]
print(" ".join(gone))
raise SystemExit(1 if gone else 0)
PYCODE
); then
  echo "error: $PY has torch but lacks: $missing (pip install -e '$ROOT')" >&2
  exit 1
fi
