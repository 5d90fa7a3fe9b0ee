"""Every rank holds the same model. Two real processes (torchrun, gloo) train each precision and
optimizer implementation through the engine; every rank then writes everything it holds, and the
ranks are compared bit for bit with each other (not only what rank 0 saves), without a resume in
between. The distributed validation must equal one process evaluating the saved checkpoint."""
import json
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from mobilenet.config import build_config, resolve
from mobilenet.engine import run
from mobilenet.optim import SETTINGS

BASE = ["--config", "configs/demo.yaml", "device=cpu", "model.width_mult=0.25", "model.resolution=32", "data.batch_size=16", "data.workers=0",
        "optim.momentum=0.9", "train.log_every=2", "train.max_steps_per_epoch=4", "--epochs", "1"]
EMA = ["train.ema_decay=0.5"]  # O2 refuses an EMA
VARIANTS = {f"{level}-{implementation}": [*BASE, f"amp.level={level}", *settings, *(EMA if level != "O2" else [])]
            for level in ("O0", "O1", "O2") for implementation, settings in SETTINGS.items()}
VARIANTS["apex-O2"] = [*BASE, "amp.level=O2", "amp.backend=apex", "optim.impl=fused"]
VARIANTS["diverged"] = [*BASE, "amp.level=O0"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, digits):
    """Runs every variant in one torchrun job; returns its folder."""
    out = tmp_path_factory.mktemp("ranks")
    (out / "variants.json").write_text(json.dumps(VARIANTS))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(ROOT / "tests" / "rank_states.py"), str(out), str(digits),
                             str(out / "variants.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def flat(tree, prefix=""):
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        if isinstance(value, (dict, list, tuple)):
            yield from flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("variant", [name for name in VARIANTS if name != "diverged"])
def test_every_rank_holds_the_same_state(ranks, digits, variant):
    held = [torch.load(ranks / variant / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    items = [dict(flat(rank)) for rank in held]
    assert items[0].keys() == items[1].keys()
    compared = 0
    for name, value in items[0].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, items[1][name]), f"{variant}: {name} differs between the ranks"
            compared += 1
        elif name != "top1":
            assert value == items[1][name], f"{variant}: {name}"
    buffers = [k for k in items[0] if k.startswith("network.") and "running_" in k]
    assert compared > 300 and len(buffers) == 2 * 27  # 27 BatchNorms: mean and variance each
    if not variant.startswith("O2") and not variant.startswith("apex"):
        assert any(k.startswith("ema.") and "running_mean" in k for k in items[0])
    # the distributed validation saw the model rank 0 saved: one process evaluating it agrees
    checkpoint = ranks / variant / "run" / "checkpoints" / "last.pt"
    settings = [s for s in VARIANTS[variant] if "=" in s and not s.startswith(("amp.backend", "optim.impl"))]
    cfg = resolve(build_config(ROOT / "configs" / "demo.yaml", settings, {"data.path": str(digits)}))
    evaluated = run(cfg, resume=checkpoint, evaluate_only=True)
    assert evaluated["top1"] == pytest.approx(held[0]["top1"], abs=1e-9), variant


def test_a_rank_that_goes_its_own_way_stops_the_run_before_the_save(ranks):
    lines = [(ranks / "diverged" / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert lines[0] == lines[1], lines
    assert lines[0].startswith("the ranks disagree at the end of epoch 1: state_dict.model.5.4.weight differs "
                               "on rank(s) 1 from rank 0"), lines[0]
    saved = torch.load(ranks / "diverged" / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert (saved["epoch"], saved["epoch_step"]) == (1, 0)  # the first epoch's, kept
