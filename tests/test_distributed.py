"""Real multi-process runs: bash train.sh --nproc 2 (torchrun, gloo on cpu)."""
import json
import re
import shutil

import pytest
import torch

import train
from conftest import TINY, train_sh
from mobilenet.checkpoint import load_checkpoint


# Synthetic images have no random augmentation and frozen BatchNorm makes each image's gradient
# independent of its batch, so B images on each of 2 processes must equal 2B images on one.
SPLIT_INVARIANT = [*TINY, "--data", "synthetic", "data.synthetic_size=96", "model.num_classes=10",
                   "train.freeze_bn=true", "optim.lr=0.05", "train.log_every=3"]


@pytest.mark.parametrize("impl", ["standard", "fused"])
def test_two_processes_of_b_equal_one_process_of_2b(tmp_path, impl):
    two = train_sh("--nproc", "2", "--optimizer", impl, "--output", tmp_path / "two",
                   *SPLIT_INVARIANT, "data.batch_size=8")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "batch 8 per process x 2 = 16 global" in two.stdout
    assert two.stdout.count("Prec@1") == 1  # rank 1 prints nothing
    assert train.main(["--optimizer", impl, "--output", str(tmp_path / "one"), *SPLIT_INVARIANT,
                       "data.batch_size=16"]) == 0
    a, b = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt")["state_dict"]
            for run in ("two", "one"))
    assert load_checkpoint(tmp_path / "two" / "checkpoints" / "last.pt")["scheduler"]["last_epoch"] == 6
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
    assert not list((tmp_path / "two").glob("*rank*"))  # only rank 0 writes


def test_distributed_val_counts_every_image_once(tmp_path, digits):
    data = tmp_path / "digits"
    shutil.copytree(digits, data)
    next((data / "val" / "3").iterdir()).unlink()  # 359 val images: not divisible by 2
    run = tmp_path / "run"
    assert train.main(["--config", "configs/demo.yaml", "--data", str(data), "--output", str(run),
                       *TINY, "train.max_steps_per_epoch=10", "--epochs", "1"]) == 0
    single = json.loads((run / "summary.json").read_text())["top1"]
    result = train_sh("--nproc", "2", "--config", "configs/demo.yaml", "--data", data, "--output",
                      tmp_path / "eval", *TINY, "--evaluate", "--resume",
                      run / "checkpoints" / "last.pt")
    assert result.returncode == 0, result.stderr[-3000:]
    top1 = float(re.search(r"\* Prec@1 ([\d.]+)", result.stdout).group(1))
    assert top1 == pytest.approx(single, abs=1e-3)
    assert round(single * 359 / 100, 3) == round(single * 359 / 100)  # a whole number of images


def test_failing_rank_ends_the_run_with_its_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # --output below a file: rank 0 fails, rank 1 waits in DDP setup
    result = train_sh("--nproc", "2", "--data", "synthetic", "--output", blocker / "run", *TINY,
                      "model.num_classes=10", "data.synthetic_size=64", timeout=120)
    assert result.returncode != 0
    assert f"error: --output {blocker / 'run'}: cannot write there" in result.stderr
