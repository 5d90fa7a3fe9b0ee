"""Every way one file can fail to load: one warning naming it, once, whatever the epoch or worker;
train draws another image, validation leaves it out and says so; the summary counts files."""
import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

import pytest
import torch
from PIL import Image

import train
from conftest import ROOT, TINY, run_train
from mobilenet.checkpoint import load_checkpoint
from mobilenet.data.datasets import ImageFolderRGB
from mobilenet.data.transforms import ValCrop


def png_header_only(path, width, height):
    """A PNG whose header claims ``width`` x ``height`` (no pixel data): PIL's bomb guard stops it."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))


def jpeg_claiming(path, source, width, height):
    """A copy of JPEG ``source`` whose frame header claims ``width`` x ``height``."""
    data = bytearray(source.read_bytes())
    sof = data.index(b"\xff\xc0") + 5  # marker, length (2), precision (1): then height, width
    data[sof:sof + 4] = struct.pack(">HH", height, width)
    path.write_bytes(bytes(data))


def write_good(folder, count, start=0):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + count):
        Image.new("RGB", (40, 30), (10 * i, 100, 200)).save(folder / f"good{i}.JPEG")


def write_bad(folder):
    """One file of each failure kind; returns their names."""
    good = folder / "good0.JPEG"
    (folder / "garbage.JPEG").write_bytes(b"\0" * 100)
    (folder / "truncated.JPEG").write_bytes(good.read_bytes()[:200])
    os.mkfifo(folder / "fifo.JPEG")  # a reader that opened it plainly would wait forever
    png_header_only(folder / "bomb.JPEG", 20_000, 20_000)
    jpeg_claiming(folder / "bomb_jpeg.JPEG", good, 20_000, 20_000)
    return ["garbage.JPEG", "truncated.JPEG", "fifo.JPEG", "bomb.JPEG", "bomb_jpeg.JPEG"]


@pytest.fixture
def broken_data(tmp_path):
    """train: 7 good + 5 broken files (12 = 6 batches of 2); val: 5 good + 2 broken."""
    root = tmp_path / "data"
    write_good(root / "train" / "a", 7)
    bad_train = write_bad(root / "train" / "a")
    write_good(root / "val" / "a", 5)
    (root / "val" / "a" / "garbage.JPEG").write_bytes(b"\xff\xd8" + b"\0" * 50)
    os.mkfifo(root / "val" / "a" / "fifo.JPEG")
    return root, bad_train, ["garbage.JPEG", "fifo.JPEG"]


def test_each_broken_file_warns_once_and_the_summary_counts_files(broken_data, tmp_path, capfd):
    root, bad_train, bad_val = broken_data
    out = tmp_path / "run"
    code = train.main(["--config", "configs/demo.yaml", "--data", str(root), "--output", str(out), *TINY,
                       "model.num_classes=1", "data.batch_size=2", "data.workers=2", "--epochs", "3"])
    captured = capfd.readouterr()
    assert code == 0, captured.err[-2000:]
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    for subset, names in (("train", bad_train), ("val", bad_val)):
        for name in names:
            mine = [w for w in warnings if f"/{subset}/a/{name} " in w]
            assert len(mine) == 1, (name, warnings)  # once, over 3 epochs and 2 workers
    assert len(warnings) == len(bad_train) + len(bad_val)
    assert any("DecompressionBombError" in w and "bomb.JPEG" in w for w in warnings)
    assert any("not a regular file" in w and "fifo.JPEG" in w for w in warnings)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unreadable_images"] == 7 and summary["val_images_scored"] == 5
    assert "5 images, 2 unreadable left out" in captured.out
    assert "warning: 7 unreadable image files were skipped" in captured.out


def test_validation_never_substitutes_an_unreadable_image(broken_data, capfd):
    root, _, _ = broken_data
    val = ImageFolderRGB(root / "val", ValCrop(24, 1.0), leave_out=(3, 24, 24))
    labels = [val[i][1] for i in range(len(val))]
    names = [os.path.basename(path) for path, _ in val.samples]
    assert [name for name, label in zip(names, labels) if label == -1] == ["fifo.JPEG", "garbage.JPEG"]
    assert all(val[names.index(n)][0].sum() == 0 for n in ("fifo.JPEG", "garbage.JPEG"))
    assert len(re.findall("warning: skipping unreadable image", capfd.readouterr().err)) == 2


def test_accuracy_leaves_out_what_could_not_be_read():
    from mobilenet.validation import accuracy
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]])
    net = torch.nn.Linear(2, 2)
    net.weight.data = torch.eye(2)
    net.bias.data.zero_()
    labels = torch.tensor([0, 0, -1])  # hit, miss, unreadable
    result = accuracy(net, [(logits, labels)], contextlib.nullcontext, torch.device("cpu"))
    assert (result.top1, result.scored, result.left_out) == (50.0, 2, 1)


def test_class_set_mismatch_names_the_classes(tmp_path, digits, capsys):
    import shutil
    root = tmp_path / "data"
    shutil.copytree(digits, root)
    shutil.rmtree(root / "val" / "3")
    (root / "val" / "x9").mkdir()
    shutil.copy(next((root / "val" / "4").iterdir()), root / "val" / "x9")
    code = train.main(["--config", "configs/demo.yaml", "--data", str(root), "--output", str(tmp_path / "run"),
                       *TINY])
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "not in val: 3;" in error[0] and "only in val: x9" in error[0]


def test_a_plain_folder_has_torchvision_image_folders_classes_samples_and_order(tmp_path):
    from torchvision.datasets import ImageFolder
    for name in ("b/x.JPEG", "b/sub/y.png", "b/notes.txt", "a/2.jpg", "a/10.webp", "a/z/deep/q.Tiff", "c d/.h.jpeg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    ours, theirs = ImageFolderRGB(tmp_path, ValCrop(24, 1.0)), ImageFolder(tmp_path)
    assert (ours.classes, ours.samples, ours.targets) == (theirs.classes, theirs.samples, theirs.targets)
    assert len(ours) == 6


def test_the_data_record_tells_files_exchanged_between_classes_apart(tmp_path):
    """Two files exchanged between class folders, their names kept: the same image count, other
    labels, so another record (a mid-epoch resume refuses it; the moved file: the test below)."""
    from mobilenet.data.datasets import data_record
    for name in ("a/1.jpg", "a/2.jpg", "b/3.jpg", "b/4.jpg"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())

    def record():
        return data_record(ImageFolderRGB(tmp_path, ValCrop(24, 1.0)))
    before = record()
    os.rename(tmp_path / "a" / "1.jpg", tmp_path / "swap")
    os.rename(tmp_path / "b" / "3.jpg", tmp_path / "a" / "3.jpg")
    os.rename(tmp_path / "swap", tmp_path / "b" / "1.jpg")
    after = record()
    assert after["images"] == before["images"] == 4 and after["fingerprint"] != before["fingerprint"]


def test_links_back_up_the_tree_are_read_once(tmp_path, digits):
    """A link to the parent folder (a loop), one into another class, and a loop below a class folder
    (its own sub-folder): each real folder is read once, under its own class, with one warning line;
    the set keeps its images (1,437 and the one in the sub-folder). In a process of its own: a scan
    that loops would never end."""
    data = tmp_path / "data"
    shutil.copytree(digits, data)
    (data / "train" / "0" / "up").symlink_to("..")
    (data / "train" / "0" / "three").symlink_to(data / "train" / "3")
    (data / "train" / "1" / "again.jpg").symlink_to(next((data / "train" / "1").iterdir()))
    (data / "train" / "0" / "sub").mkdir()
    shutil.copy(next((data / "train" / "0").glob("*.jpg")), data / "train" / "0" / "sub" / "extra.jpg")
    (data / "train" / "0" / "sub" / "loop").symlink_to("../sub")
    result = run_train("--config", "configs/demo.yaml", "--data", data, "--output", tmp_path / "run", *TINY,
                       "train.max_steps=1", "--epochs", "1", timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1438 train / 360 val images" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "reached again through a link" in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {data / 'train'}: 3 folder(s)"), warnings


def test_a_data_path_the_system_refuses_is_one_line(tmp_path, refusal):
    code, stderr = refusal("--data", "/tmp/" + "x" * 300, "--output", tmp_path / "run", *TINY)
    assert code == 2 and stderr.strip().endswith("File name too long"), stderr
    assert stderr.strip().startswith("error: --data /tmp/xxx") and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "traceback-rank0.txt").exists()


def test_names_that_are_not_utf8_train_and_resume(tmp_path, digits):
    """Names are bytes on Linux: a data folder, a class folder and a file whose names are not valid
    UTF-8 train, print (also to a terminal that takes UTF-8 only) and resume mid-epoch; a file moved
    to another class under the same name (the image count kept), or renamed to another name that is
    not UTF-8, is other data to the resume."""
    root = os.fsencode(tmp_path) + b"/d\xe9"
    shutil.copytree(digits, os.fsdecode(root))
    for split in (b"train", b"val"):
        os.rename(root + b"/" + split + b"/7", root + b"/" + split + b"/sev\xe9n")
    first = sorted(os.listdir(root + b"/train/3"))[0]
    os.rename(root + b"/train/3/" + first, root + b"/train/3/\xff\xfe.jpg")
    out = tmp_path / "run"

    def train_py(*extra):
        return subprocess.run([sys.executable, "train.py", "--config", "configs/demo.yaml", *TINY, "--data",
                               os.fsdecode(root), "--output", str(out), "--epochs", "1",
                               "train.max_steps_per_epoch=6", *extra], cwd=ROOT, capture_output=True,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"}, timeout=120)
    stopped = train_py("train.max_steps=3")
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    assert os.fsencode(os.fsdecode(root)) in stopped.stdout  # the name's own bytes
    os.rename(root + b"/train/3/\xff\xfe.jpg", root + b"/train/5/\xff\xfe.jpg")
    moved = train_py("--resume", "auto")
    other = b"on other data (train: the same 1437 images, other files or labels)"
    assert moved.returncode == 2 and other in moved.stderr
    # another name that a lossy decoding ('?' for each byte that is not UTF-8) would not tell apart
    os.rename(root + b"/train/5/\xff\xfe.jpg", root + b"/train/3/\xfe\xff.jpg")
    renamed = train_py("--resume", "auto")
    assert renamed.returncode == 2 and other in renamed.stderr
    os.rename(root + b"/train/3/\xfe\xff.jpg", root + b"/train/3/\xff\xfe.jpg")
    resumed = train_py("--resume", "auto")
    assert resumed.returncode == 0 and b"data changed" not in resumed.stdout, resumed.stderr[-2000:]
    assert load_checkpoint(out / "checkpoints" / "last.pt")["epoch"] == 1


