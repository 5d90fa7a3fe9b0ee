import json
import subprocess

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from conftest import ROOT, TINY
from mobilenet.checkpoint import load_checkpoint
from mobilenet.data.datasets import SyntheticImages
from mobilenet.training import DevicePrefetcher, IMAGENET_MEAN, IMAGENET_STD


def train_digits(digits, out, *extra):
    args = ["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out),
            "--optimizer", "fused", *TINY, "train.max_steps_per_epoch=8", *extra]
    assert train.main(args) == 0
    return json.loads((out / "summary.json").read_text())


def test_run_directory_and_tensorboard(tmp_path, digits):
    out = tmp_path / "run"
    summary = train_digits(digits, out, "--epochs", "2")
    assert {"top1", "top5", "epochs", "img_per_s", "optimizer", "device", "amp"} <= summary.keys()
    assert summary["epochs"] == 2 and summary["optimizer"] == "fused" and summary["device"] == "cpu"
    assert summary["img_per_s"] > 0 and 0 <= summary["top1"] <= 100
    assert (out / "config.yaml").read_text().count("impl: fused") == 1
    for name in ("last.pt", "best.pt"):
        state = load_checkpoint(out / "checkpoints" / name)
        assert {"epoch", "arch", "state_dict", "best_prec1", "optimizer"} <= state.keys()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "val"] == [0, 1]
    assert all(r["loss"] > 0 for r in records if r["kind"] == "train")

    events = EventAccumulator(str(out))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/img_per_s", "val/top1", "val/top5",
            "val/epoch_time_s"} <= tags
    top1 = events.Scalars("val/top1")
    assert len(top1) == 2 and abs(top1[-1].value - summary["top1"]) < 1e-3
    assert len(events.Scalars("train/loss")) == 4  # steps 5 and 8 of each epoch


def test_resume_continues_and_evaluate_reproduces_top1(tmp_path, digits, capsys):
    out = tmp_path / "run"
    train_digits(digits, out, "--epochs", "1")
    first = load_checkpoint(out / "checkpoints" / "last.pt")
    summary = train_digits(digits, out, "--epochs", "2", "--resume", "auto")
    assert summary["epochs"] == 2
    second = load_checkpoint(out / "checkpoints" / "last.pt")
    assert second["epoch"] == 2 and second["scheduler"]["last_epoch"] == 16
    assert not torch.equal(first["state_dict"]["fc.weight"], second["state_dict"]["fc.weight"])

    capsys.readouterr()
    assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output",
                       str(tmp_path / "eval"), *TINY, "--evaluate",
                       "--resume", str(out / "checkpoints" / "last.pt")]) == 0
    assert f"* Prec@1 {summary['top1']:.3f}" in capsys.readouterr().out


def test_standard_and_fused_train_to_the_same_weights(tmp_path, digits):
    # The kernels may round differently in the last bit; a gentle lr keeps 8 steps from amplifying it.
    for impl in ("standard", "fused"):
        train_digits(digits, tmp_path / impl, "--epochs", "1", "--optimizer", impl, "optim.lr=0.02")
    a, b = (load_checkpoint(tmp_path / impl / "checkpoints" / "last.pt")["state_dict"]
            for impl in ("standard", "fused"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_prefetcher_yields_every_batch_normalised_on_the_device(device):
    loader = torch.utils.data.DataLoader(SyntheticImages(40, 8, 5), batch_size=8,
                                         pin_memory=device != "cpu")
    batches = list(DevicePrefetcher(loader, torch.device(device), channels_last=True))
    assert len(batches) == len(loader) == 5
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    for (images, labels), (raw, raw_labels) in zip(batches, loader):
        assert images.device.type == device and images.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(images.cpu(), (raw.float() / 255 - mean) / std)
        assert torch.equal(labels.cpu(), raw_labels)


def test_synthetic_data(tmp_path):
    out = tmp_path / "synthetic"
    assert train.main(["--data", "synthetic", "--output", str(out), *TINY,
                       "data.synthetic_size=128", "model.num_classes=10"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 1 and summary["img_per_s"] > 0


def test_demo_reaches_90_percent_through_train_sh(tmp_path):
    """The README's main command, as a user runs it: bundled digits, fused optimizer."""
    out = tmp_path / "demo"
    result = subprocess.run(["bash", "train.sh", "--optimizer=fused", "--output", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["top1"] >= 90 and summary["optimizer_class"] == "SGD (fused kernel)"
    assert "img/s" in result.stdout and str(out) in result.stdout.splitlines()[-1]
