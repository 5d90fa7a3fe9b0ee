"""Every rank holds the same model. Two real processes (torchrun, gloo) train each precision and
optimizer implementation through the engine; every rank then writes everything it holds, and the
ranks are compared bit for bit with each other (not only what rank 0 saves), without a resume in
between. The distributed validation must equal one process evaluating the saved checkpoint."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from mobilenet.config import build_config, resolve
from mobilenet.engine import run

from conftest import BASE_RANKS as BASE, VARIANTS  # noqa: F401 (the ranks fixture is conftest's)


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


def two_ranks_of_one_job(tmp_path, args_of_rank):
    """Two processes of a --distributed job (ModelZoo's own launch: every process started by hand,
    each with its own command); returns [(exit code, stderr)] by rank."""
    from conftest import free_port
    env = {**os.environ, "RANK_SIZE": "2", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "train.py", *BASE, "--output", str(tmp_path / "run"), "--distributed",
                               *args_of_rank(rank)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "RANK_ID": str(rank)}) for rank in (0, 1)]
    return [(proc.wait(timeout=120), proc.stderr.read()) for proc in procs]


def test_a_rank_with_other_settings_or_other_data_is_named_before_the_first_step(tmp_path, digits):
    ended = two_ranks_of_one_job(tmp_path, lambda rank: ["--data", str(digits), *(["optim.lr=0.2"] if rank else [])])
    for code, stderr in ended:
        assert code == 2 and stderr.strip().splitlines()[-1] == (
            "error: rank 1 was given other settings than rank 0: optim.lr is 0.2 there, 0.1 on rank 0 (and 1 "
            "more); start every process of the job with the same command and settings"), stderr[-2000:]
    other = tmp_path / "other"
    shutil.copytree(digits, other)
    next((other / "train" / "4").iterdir()).unlink()
    ended = two_ranks_of_one_job(tmp_path, lambda rank: ["--data", str(other if rank else digits)])
    for code, stderr in ended:
        assert code == 2 and stderr.strip().splitlines()[-1] == (
            "error: rank 1 reads other data than rank 0 (train: 1437 images on rank 0, 1436 there); every node "
            "needs the same copy of the dataset"), stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
