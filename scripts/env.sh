# Sourced by train.sh and scripts/test.sh: sets PY to the Python that runs the app.
# The active Python is used as it is when it imports torch (an Ascend environment with torch_npu,
# say); otherwise .venv, created from requirements.txt on first use.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=""
for candidate in python python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
    PY="$(command -v "$candidate")"
    break
  fi
done
if [ -z "$PY" ]; then
  PY="$ROOT/.venv/bin/python"
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "Setting up $ROOT/.venv from requirements.txt (first run: a few minutes)..." >&2
    python3 -m venv "$ROOT/.venv"
    "$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt" >&2
  fi
fi
if ! missing=$("$PY" - <<'PYCODE'
import importlib.util
need = ["torchvision", "yaml", "tensorboard", "sklearn", "PIL", "simplejpeg"]
gone = [m for m in need if importlib.util.find_spec(m) is None]
print(" ".join(gone))
raise SystemExit(1 if gone else 0)
PYCODE
); then
  echo "error: $PY has torch but lacks: $missing (pip install -r $ROOT/requirements.txt)" >&2
  exit 1
fi
