"""The prepared dataset (scripts/prepare_data.py, mobilenet/data/prepared.py): made from a real
folder, it trains as the folder does (classes, labels, order, per-sample crop draws), resumes
exactly mid-epoch, keeps unreadable files as such, and a stopped preparation never trains."""
import json
import random
import shutil
import subprocess
import sys

import pytest
from PIL import Image

import train
from conftest import ROOT, TINY, assert_same_weights
from mobilenet.data import ImageFolderRGB
from mobilenet.data.decode import train_transform
from mobilenet.data.prepared import PreparedImages, prepare


def prepare_data(*args):
    return subprocess.run([sys.executable, "scripts/prepare_data.py", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def source(tmp_path_factory, digits):
    """The digits with a few photo-sized images (so that some are resized), one broken file in
    train and one in val."""
    root = tmp_path_factory.mktemp("source") / "digits"
    shutil.copytree(digits, root)
    for i, size in enumerate([(500, 375), (375, 500), (1200, 900)]):
        Image.new("RGB", size, (40 * i, 120, 200)).save(root / "train" / "4" / f"photo{i}.jpg", quality=96,
                                                        subsampling=0)
    (root / "train" / "2" / "broken.jpg").write_bytes(b"\xff\xd8not a jpeg")
    (root / "val" / "3" / "broken.jpg").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def prepared(source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("prepared") / "set"
    result = prepare_data(source, dst)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"prepared {dst}: 1441 train / 361 val images (2 unreadable, kept as such)" in result.stdout
    return dst


def test_the_prepared_set_is_the_folder_in_its_order_with_bounded_sides(source, prepared):
    transform = train_transform(32, 0.5, False)
    folder = ImageFolderRGB(source / "train", transform)
    ours = PreparedImages(prepared, "train", transform)
    assert ours.classes == folder.classes and ours.samples == folder.samples and ours.targets == folder.targets
    about = json.loads((prepared / "prepared.json").read_text())
    assert about["settings"]["max_side"] == 384 and about["splits"]["val"]["unreadable"] == 1
    for index, (path, _) in enumerate(ours.samples):
        if "broken" in path:
            continue
        image, original = ours.read(index), folder.read(index)
        assert max(image.height, image.width) <= 384 and image.data[:2] == b"\xff\xd8"
        assert image.turbo and b"\xff\xc2" not in image.data  # baseline (no progressive frame header)
        if max(original.height, original.width) <= 384:  # kept at its size: the same crop from the same seed
            seed = 1000 + index
            drawn = [transform.params(im.height, im.width, random.Random(seed)) for im in (image, original)]
            assert drawn[0] == drawn[1]
    photo = next(i for i, (path, _) in enumerate(ours.samples) if path.endswith("photo2.jpg"))
    assert (ours.read(photo).height, ours.read(photo).width) == (288, 384)  # 900 x 1200 -> longer side 384


def test_it_trains_resumes_exactly_and_reports_its_unreadable_files(prepared, tmp_path, capfd):
    args = ["--config", "configs/demo.yaml", *TINY, "--data", str(prepared), "train.max_steps_per_epoch=6",
            "--epochs", "2"]
    assert train.main([*args, "--output", str(tmp_path / "straight")]) == 0
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "train.max_steps=9"]) == 0  # mid-epoch 1
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "--resume", "auto"]) == 0
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    err = capfd.readouterr().err
    assert "warning: skipping unreadable image" in err and "val/3/broken.jpg (OSError: unreadable when the set " \
                                                            "was prepared" in err
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["val_images_scored"] == 360  # the broken one left out


def test_another_preparation_is_other_data_to_a_mid_epoch_resume(source, prepared, tmp_path, capsys):
    args = ["--config", "configs/demo.yaml", *TINY, "train.max_steps_per_epoch=6", "--epochs", "2",
            "--output", str(tmp_path / "run")]
    assert train.main([*args, "--data", str(prepared), "train.max_steps=3"]) == 0
    other = tmp_path / "other"
    assert prepare_data(source, other, "--quality", "80").returncode == 0
    capsys.readouterr()
    assert train.main([*args, "--data", str(other), "--resume", "auto"]) == 2
    assert "on other data (train: the same 1441 images, other files or labels; val: the same 361" in capsys.readouterr().err


def test_a_stopped_preparation_does_not_train_and_continues(source, prepared, tmp_path, capsys):
    dst = tmp_path / "set"

    def stop_after_a_shard(line, end="\n"):
        if (dst / "train-00001.index.npz").exists():
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        prepare(source, dst, say=stop_after_a_shard, shard=512)
    first = (dst / "train-00000.jpegs").stat().st_mtime_ns
    capsys.readouterr()
    assert train.main(["--config", "configs/demo.yaml", *TINY, "--data", str(dst), "--output", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --data {dst}: its preparation did not finish (no prepared.json); "
                                               f"run scripts/prepare_data.py with the same SRC and DST again to "
                                               f"complete it")
    prepare(source, dst, say=lambda line, end="\n": None, shard=512)
    assert (dst / "train-00000.jpegs").stat().st_mtime_ns == first  # kept, not written again
    ours, whole = (PreparedImages(root, "train", None) for root in (dst, prepared))
    assert len(ours.shards) == 3 and len(whole.shards) == 1
    assert ours.samples == whole.samples and all(ours.read(i).data == whole.read(i).data
                                                 for i in range(len(ours.samples)) if ours.lengths[i])


def test_a_bad_source_or_destination_is_one_line_and_writes_nothing(source, prepared, tmp_path):
    (tmp_path / "noval" / "train" / "a").mkdir(parents=True)
    shutil.copy(next((source / "train" / "0").iterdir()), tmp_path / "noval" / "train" / "a")
    result = prepare_data(tmp_path / "noval", tmp_path / "out")
    assert result.returncode == 2 and not (tmp_path / "out").exists() and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: SRC {tmp_path / 'noval'}: no 'val' folder (expected "
                                          f"{tmp_path / 'noval'}/val/<class>/*.JPEG)"]
    result = prepare_data(source, prepared, "--max-side", "256")
    assert result.returncode == 2 and "holds a preparation of another source or with other settings" in result.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    result = prepare_data(source, tmp_path / "busy")
    assert result.returncode == 2 and "not empty and not a prepared set" in result.stderr
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]
