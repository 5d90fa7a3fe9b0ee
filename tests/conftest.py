import subprocess
import sys
from pathlib import Path

import pytest

from mobilenet.data import build_digits

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """The bundled demo set, built from scikit-learn's digits into a temporary folder."""
    return build_digits(tmp_path_factory.mktemp("data") / "digits")


def run_train(*args, cwd=ROOT, timeout=600):
    """python train.py ARGS in a subprocess; returns the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


# Settings that keep a digits run to a few seconds.
TINY = ["model.width_mult=0.25", "model.resolution=32", "train.log_every=5",
        "data.batch_size=32", "data.workers=0"]
