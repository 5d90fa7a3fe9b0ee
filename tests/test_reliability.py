"""Kills, signals, non-finite losses, broken images and bad input."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from PIL import Image

import train
from conftest import ROOT, TINY, run_train
from mobilenet.checkpoint import load_checkpoint
from mobilenet.errors import UsageError
from mobilenet.data.datasets import ImageFolderRGB
from mobilenet.data.transforms import ValCrop

SAVER = """
import sys, torch
sys.path.insert(0, {root!r})
from mobilenet.checkpoint import save_atomic
state = {{"state_dict": {{"w": torch.randn(8_000_000)}}, "epoch": 0}}
for epoch in range(1_000_000):
    state["epoch"] = epoch
    save_atomic(state, sys.argv[1])
    print(epoch, flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.013, 0.05, 0.11])
def test_kill_9_during_save_leaves_a_loadable_checkpoint(tmp_path, delay):
    path = tmp_path / "last.pt"
    saver = subprocess.Popen([sys.executable, "-c", SAVER.format(root=str(ROOT)), str(path)],
                             stdout=subprocess.PIPE, text=True)
    saver.stdout.readline()  # the first save is complete; now kill it inside a later one
    time.sleep(delay)
    saver.send_signal(signal.SIGKILL)
    saver.wait()
    state = load_checkpoint(path)
    assert state["state_dict"]["w"].numel() == 8_000_000 and state["epoch"] >= 0


def test_fused_checkpoint_resumes_with_standard_optimizer(tmp_path, digits):
    out = tmp_path / "run"
    base = ["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out), *TINY,
            "train.max_steps_per_epoch=4"]
    assert train.main([*base, "--optimizer", "fused", "--epochs", "1"]) == 0
    assert train.main([*base, "--optimizer", "standard", "--epochs", "2", "--resume", "auto"]) == 0
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["epoch"] == 2 and state["config"]["optim"]["impl"] == "standard"
    assert len(state["optimizer"]["state"]) == 83  # momentum buffers carried over


def test_nonfinite_loss_stops_without_overwriting_the_checkpoint(tmp_path, digits, refusal):
    out = tmp_path / "run"
    base = ["--config", "configs/demo.yaml", "--data", digits, "--output", out, *TINY,
            "train.max_steps_per_epoch=6", "--epochs", "1"]
    assert train.main([*map(str, base)]) == 0
    before = (out / "checkpoints" / "last.pt").read_bytes()
    # a diverging run is not let into a directory that holds a run unless asked (--start-over)...
    assert refusal(*base, "optim.lr=1e30", "schedule.warmup_epochs=0")[0] == 2
    assert (out / "checkpoints" / "last.pt").read_bytes() == before
    # ...and, where it runs, it stops at the first non-finite loss and saves nothing
    fresh = tmp_path / "fresh"
    result = run_train(*base[:4], "--output", fresh, *base[6:], "optim.lr=1e30", "schedule.warmup_epochs=0")
    assert result.returncode == 1  # a failure during training
    assert result.stderr.startswith("error: the loss became nan") and result.stderr.count("\n") == 1
    assert not (fresh / "checkpoints").exists()


def write_broken_folder(root):
    """One class folder of the kinds of files ImageNet really holds, plus two broken ones."""
    folder = root / "train" / "n01"
    folder.mkdir(parents=True)
    Image.new("CMYK", (40, 30), (0, 255, 255, 0)).save(folder / "cmyk.JPEG")  # red
    Image.new("L", (40, 30), 128).save(folder / "gray.JPEG")
    Image.new("RGB", (40, 30), (0, 0, 255)).save(folder / "png_named.JPEG", format="PNG")
    Image.new("RGB", (40, 30), (0, 255, 0)).save(folder / "good.JPEG")
    full = (folder / "good.JPEG").read_bytes()
    (folder / "truncated.JPEG").write_bytes(full[: len(full) // 2])
    (folder / "garbage.JPEG").write_bytes(b"\0" * 100)
    return folder


def test_decodes_cmyk_gray_png_and_skips_broken_files(tmp_path, capfd):
    folder = write_broken_folder(tmp_path)
    dataset = ImageFolderRGB(folder.parent, ValCrop(24, 1.0))
    names = [os.path.basename(p) for p, _ in dataset.samples]
    images = {name: dataset[i][0] for i, name in enumerate(names)}
    assert all(image.shape == (3, 24, 24) and image.dtype == torch.uint8 for image in images.values())
    centre = {name: image[:, 12, 12].tolist() for name, image in images.items()}
    assert centre["cmyk.JPEG"][0] > 240 and max(centre["cmyk.JPEG"][1:]) < 15
    assert all(abs(c - 128) <= 2 for c in centre["gray.JPEG"])
    assert centre["png_named.JPEG"] == [0, 0, 255]
    # garbage.JPEG and truncated.JPEG are replaced by the next readable file, with a warning each
    assert torch.equal(images["garbage.JPEG"], images["good.JPEG"])
    assert torch.equal(images["truncated.JPEG"], images["cmyk.JPEG"])  # wraps around
    warnings = capfd.readouterr().err.splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: skipping unreadable image") for w in warnings)
    assert int(dataset.unreadable.sum()) == 2
    with pytest.raises(UsageError, match="garbage.JPEG: unreadable image"):
        ImageFolderRGB(folder.parent, ValCrop(24, 1.0), strict=True)[names.index("garbage.JPEG")]


def test_training_skips_broken_files_or_stops_when_strict(tmp_path, train_here):
    data = tmp_path / "data"
    write_broken_folder(data)
    (data / "val").mkdir()
    (data / "train" / "n01").rename(data / "val" / "n01")
    write_broken_folder(data)
    base = ["--data", data, "--config", "configs/demo.yaml", *TINY, "model.num_classes=1",
            "data.batch_size=2", "data.workers=2", "--epochs", "1"]
    result = train_here(*base, "--output", tmp_path / "lenient")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "garbage.JPEG" in result.stderr
    assert json.loads((tmp_path / "lenient" / "summary.json").read_text())["unreadable_images"] >= 2
    strict = train_here(*base, "--output", tmp_path / "strict", "data.strict=true")
    assert strict.returncode == 2 and strict.stderr.count("\n") == 1
    assert "unreadable image" in strict.stderr and "data.strict=true" in strict.stderr


def test_a_val_set_with_no_readable_image_is_an_error_after_saving_the_training(tmp_path, digits, train_here):
    """Every val file unreadable: no accuracy to report, so not a success (exit 2, one line); the
    epoch's training is saved in last.pt (no best.pt), and resumes once the val files are fixed."""
    data = tmp_path / "data"
    shutil.copytree(digits, data)
    for path in (data / "val").rglob("*.jpg"):
        path.write_bytes(b"not an image")
    out = tmp_path / "run"
    base = ["--data", data, "--config", "configs/demo.yaml", *TINY, "train.max_steps_per_epoch=3",
            "--epochs", "2", "--output", out]
    result = train_here(*base)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if not line.startswith("warning:")]
    assert errors == [f"error: --data {data}: none of the 360 val images could be read (see the warnings), "
                      f"so there is no accuracy; the training is saved in {out}/checkpoints/last.pt: fix "
                      f"the val files, then resume with --resume auto"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["last.pt"]
    shutil.rmtree(data / "val")
    shutil.copytree(digits / "val", data / "val")
    resumed = train_here(*base, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and "epoch 1, batch 0" in resumed.stdout
    assert "checkpoints/last.pt and best.pt" in resumed.stdout.splitlines()[-1]


def test_bad_inputs_are_one_line_errors(tmp_path, digits, refusal):
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "val").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    other = tmp_path / "wide.pt"
    from mobilenet.model import MobileNetV1
    torch.save({"state_dict": MobileNetV1(0.5, 10).state_dict()}, other)
    cases = [
        (["--data", tmp_path / "empty"], "empty"),
        (["--data", digits, "--output", blocker / "run"], "cannot write there"),
        (["--data", digits, "--resume", other], "wide.pt: model.0.0.weight has shape"),
    ]
    for args, fragment in cases:
        code, stderr = refusal("--config", "configs/demo.yaml", *TINY, "--output", tmp_path / "out", *args)
        assert code == 2, stderr
        assert stderr.count("\n") == 1 and fragment in stderr, stderr


def test_a_save_between_loss_checks_keeps_the_last_good_checkpoint(tmp_path):
    """The loss is checked at log intervals; a periodic or signal save between them must not write
    diverged weights over the last good checkpoint."""
    from types import SimpleNamespace

    from mobilenet.checkpoint import CheckpointSaver
    from mobilenet.config import build_config, resolve
    from mobilenet.distributed import World
    from mobilenet.engine import save_last_if_finite
    from mobilenet.errors import TrainingFailure
    from mobilenet.state import TrainingState
    cfg = resolve(build_config(ROOT / "configs" / "demo.yaml", ["device=cpu"]))
    state = TrainingState(cfg, torch.device("cpu"), steps_per_epoch=10)
    r = SimpleNamespace(state=state, step=state.step, world=World())
    saver = CheckpointSaver(tmp_path)
    save_last_if_finite(r, saver)
    good = saver.last.read_bytes()
    with torch.no_grad():
        r.state.step.net.fc.weight[0, 0] = float("nan")
    with pytest.raises(TrainingFailure, match="the weights became non-finite"):
        save_last_if_finite(r, saver)
    assert saver.last.read_bytes() == good
