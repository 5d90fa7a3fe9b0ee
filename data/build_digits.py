"""Writes the bundled demo set (scikit-learn's digits) to data/digits/{train,val}/<digit>/*.jpg.

train.py does this on first use of --data digits; run it by hand to rebuild: rm -r data/digits first.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mobilenet.data import DIGITS_ROOT, build_digits  # noqa: E402

if __name__ == "__main__":
    print(build_digits(DIGITS_ROOT))
