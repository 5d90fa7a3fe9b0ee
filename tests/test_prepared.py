"""The prepared dataset (scripts/prepare_data.py, mobilenet/data/prepared.py): made from a real
folder, it trains as the folder does (classes, labels, order, per-sample crop draws), resumes
exactly mid-epoch, keeps unreadable files as such, and a stopped preparation never trains."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys

import pytest
from PIL import Image

import train
from conftest import ROOT, TINY, assert_same_weights, process_tree
from mobilenet.data.datasets import ImageFolderRGB
from mobilenet.data.transforms import TrainCrop
from prepare_data import prepare
from mobilenet.data.prepared import PreparedImages
from mobilenet.errors import STOP_SIGNALS


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
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]  # no worker's
    assert f"prepared {dst}: 1441 train / 361 val images (2 unreadable, kept as such)" in result.stdout
    return dst


def test_the_prepared_set_is_the_folder_in_its_order_with_bounded_sides(source, prepared):
    transform = TrainCrop(32, scale=(0.5, 1.0), hflip=False)
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
    other = "on other data (train: the same 1441 images, other files or labels; val: the same 361"
    assert other in capsys.readouterr().err


def test_a_stopped_preparation_does_not_train_and_continues(source, prepared, tmp_path, capsys):
    dst = tmp_path / "set"

    def stop_after_a_shard(line, end="\n"):
        if (dst / "train-00001.index.npz").exists():
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        prepare(source, dst, say=stop_after_a_shard, shard=512)
    first = (dst / "train-00000.jpegs").stat().st_mtime_ns
    capsys.readouterr()
    for workers in ("0", "auto"):  # data.workers auto looks at the set first
        assert train.main(["--config", "configs/demo.yaml", *TINY, "--data", str(dst), f"data.workers={workers}",
                           "--output", str(tmp_path / "run")]) == 2
        assert capsys.readouterr().err.strip() == (f"error: --data {dst}: its preparation did not finish (no "
                                                   f"prepared.json); run python scripts/prepare_data.py {source} "
                                                   f"{dst} to complete it")
    prepare(source, dst, say=lambda line, end="\n": None, shard=512)
    assert (dst / "train-00000.jpegs").stat().st_mtime_ns == first  # kept, not written again
    ours, whole = (PreparedImages(root, "train", None) for root in (dst, prepared))
    assert len(ours.shards) == 3 and len(whole.shards) == 1
    assert ours.samples == whole.samples and all(ours.read(i).data == whole.read(i).data
                                                 for i in range(len(ours.samples)) if ours.lengths[i])


def test_a_bad_source_or_destination_is_one_line_and_writes_nothing(source, prepared, tmp_path, capsys):
    """The first in a process of its own, its one line alone; the others through the same main()
    in this process (without a start of torch each)."""
    import prepare_data as script

    def refused(*args):
        capsys.readouterr()
        handlers = {stop: signal.getsignal(stop) for stop in STOP_SIGNALS}  # main() sets its own
        try:
            return script.main([*map(str, args)]), capsys.readouterr()
        finally:
            for stop, handler in handlers.items():
                signal.signal(stop, handler)

    (tmp_path / "noval" / "train" / "a").mkdir(parents=True)
    shutil.copy(next((source / "train" / "0").iterdir()), tmp_path / "noval" / "train" / "a")
    result = prepare_data(tmp_path / "noval", tmp_path / "out")
    assert result.returncode == 2 and not (tmp_path / "out").exists() and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: SRC {tmp_path / 'noval'}: no 'val' folder (expected "
                                          f"{tmp_path / 'noval'}/val/<class>/*.JPEG)"]
    code, output = refused(source, prepared, "--max-side", "256")
    assert code == 2 and "holds a preparation of SRC with other settings" in output.err
    (tmp_path / "noval" / "val" / "a").mkdir(parents=True)
    shutil.copy(next((source / "val" / "0").iterdir()), tmp_path / "noval" / "val" / "a")
    code, output = refused(tmp_path / "noval", prepared)
    assert code == 2 and "holds a preparation of another source" in output.err
    inside = source / "train" / "0" / "prepared"
    code, output = refused(source, inside)
    assert code == 2 and not inside.exists() and output.err.splitlines() == [
        f"error: DST {inside}: inside SRC {source}, whose class folders it would change; pass a folder outside SRC"]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    code, output = refused(source, tmp_path / "busy")
    assert code == 2 and "not empty and not a prepared set" in output.err
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]


@pytest.fixture(scope="module")
def slow_source(source, tmp_path_factory):
    """The source with photos of noise, which re-encode slowly enough to be stopped midway."""
    root = tmp_path_factory.mktemp("slow") / "digits"
    shutil.copytree(source, root)
    for i in range(48):
        Image.effect_noise((1600, 1200), 64).convert("RGB").save(root / "train" / "1" / f"noise{i}.jpg", quality=95)
    return root


def start_preparation(src, dst):
    """scripts/prepare_data.py in a session of its own (a terminal's job); returns the Popen once its
    progress line has begun."""
    proc = subprocess.Popen([sys.executable, "scripts/prepare_data.py", str(src), str(dst), "--workers", "2"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    seen = b""
    while b"train: [" not in seen:
        seen += proc.stderr.read1(256) or b"?"
    return proc


@pytest.mark.parametrize("ending", ["Ctrl-C", "SIGTERM", "a dead worker"])
def test_a_stop_or_a_dead_worker_is_one_line_and_the_same_command_completes_it(slow_source, tmp_path, ending):
    dst = tmp_path / "set"
    proc = start_preparation(slow_source, dst)
    if ending == "a dead worker":  # the kernel's out-of-memory killer, say
        os.kill(max(process_tree(proc.pid)[1:]), signal.SIGKILL)
    else:  # to the whole job, as a terminal or `timeout` does
        stop = signal.SIGINT if ending == "Ctrl-C" else signal.SIGTERM
        os.killpg(proc.pid, stop)
    _, stderr = proc.communicate(timeout=60)
    lines = [line for line in stderr.decode().replace("\r", "\n").splitlines()
             if line.strip() and "train: [" not in line]
    if ending == "a dead worker":
        assert proc.returncode == 1 and lines == ["error: a worker process of the preparation died (killed, or out "
                                                  "of memory?); the whole shards written before stay: run the same "
                                                  "command again to continue"], stderr
    else:
        assert proc.returncode == 128 + stop and lines == [
            f"{stop.name}: stopped: {dst} is not prepared yet (no prepared.json: it does not train); the same "
            f"command continues from its last whole shard"], stderr
    assert not (dst / "prepared.json").exists()
    done = prepare_data(slow_source, dst)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    ours = PreparedImages(dst, "train", None)
    assert ours.samples == ImageFolderRGB(slow_source / "train", None).samples and ours.lengths.all() == (
        "broken" not in str(ours.samples))


def test_a_full_disk_is_one_line_and_no_wait(source, tmp_path):
    from conftest import in_small_tmpfs
    mount, result = in_small_tmpfs(tmp_path, 1 << 20, "{python} scripts/prepare_data.py {src} {mount}/set; "
                                                      "echo exit $?", src=source)
    errors = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert "exit 1" in result.stdout and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors == [f"error: {mount}/set/train-00000.jpegs: cannot write (No space left on device); the whole "
                      f"shards written before stay: free some space (or fix the folder) and run the same command "
                      f"again to continue"], result.stderr[-2000:]


def test_a_continuation_after_src_changed_holds_what_src_holds(source, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "set"
    shutil.copytree(source, src)

    def stop_after_a_shard(line, end="\n"):
        if (dst / "train-00001.index.npz").exists():
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        prepare(src, dst, say=stop_after_a_shard, shard=512)
    for path in sorted((src / "train").rglob("0*.jpg"))[:300]:
        path.unlink()
    said = []
    prepare(src, dst, say=lambda line, end="\n": said.append(line), shard=512)
    ours = PreparedImages(dst, "train", None)
    assert ours.samples == ImageFolderRGB(src / "train", None).samples and len(ours.samples) == 1141
    assert "train-00000.jpegs: SRC's files or labels there changed; written again" in said
    assert sorted(path.name for path in dst.glob("train-*.jpegs")) == ["train-00000.jpegs", "train-00001.jpegs",
                                                                      "train-00002.jpegs"]


DAMAGES = {
    "an index removed": ("train-00000.index.npz", lambda path: path.unlink(), "missing"),
    "a shard cut short": ("train-00000.jpegs", lambda path: path.write_bytes(path.read_bytes()[:1000]), "cut short"),
    "an empty description": ("prepared.json", lambda path: path.write_text("{}"), "not a format 1 description"),
    "a corrupt description": ("prepared.json", lambda path: path.write_text('{"format": 1, "sou'),
                              "unreadable: JSONDecodeError"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_set_names_its_file_and_the_command_that_mends_it(source, prepared, tmp_path, capsys, damage):
    dst = tmp_path / "set"
    shutil.copytree(prepared, dst)
    name, do, why = DAMAGES[damage]
    do(dst / name)
    capsys.readouterr()
    assert train.main(["--config", "configs/demo.yaml", *TINY, "--data", str(dst),
                       "--output", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    advice = f"python scripts/prepare_data.py {source} {dst}"
    assert len(error) == 1 and error[0].startswith(f"error: --data {dst}: {dst / name} is damaged (")
    assert error[0].endswith(f"); run {advice} to redo it") and why in error[0], error
    mended = subprocess.run([sys.executable, *advice.split()[1:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert mended.returncode == 0 and "nothing to do" not in mended.stderr, mended.stderr[-2000:]
    ours, whole = (PreparedImages(root, "train", None) for root in (dst, prepared))
    assert ours.samples == whole.samples and all(ours.read(i).data == whole.read(i).data
                                                 for i in range(len(ours.samples)) if ours.lengths[i])
