"""The scripts take the mobilenet package as train.py does: installed (pip install -e .), or the
checkout's through PYTHONPATH (scripts/env.sh sets it for train.sh and the tests). Imported first
by each script: where this Python finds neither, it ends the script in one line that says how to
run it, instead of an ImportError's traceback."""
import importlib.util
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("mobilenet") is None:
    sys.exit(f"error: {sys.executable} does not find the mobilenet package; run the script with the "
             f"checkout's Python ({CHECKOUT}/.venv/bin/python, which bash train.sh sets up), or as "
             f"PYTHONPATH={CHECKOUT} python {' '.join(sys.argv)}, or pip install -e {CHECKOUT}")
