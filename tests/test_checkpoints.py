"""Checkpoints and the run directory: independent files, newest-valid resume, finished runs, the
lock, interrupted saves, a full disk, and resumes that cannot continue."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from conftest import ROOT, TINY, in_small_tmpfs
from mobilenet.checkpoint import load_checkpoint

BASE = ["--config", "configs/demo.yaml", *TINY, "train.max_steps_per_epoch=4"]


def run(digits, out, *extra):
    return train.main([*BASE, "--data", str(digits), "--output", str(out), *extra])


def corrupt(path):
    path.write_bytes(b"\0" * 64 + path.read_bytes()[64:])  # in place, as a failing disk does


@pytest.fixture(scope="session")
def two_epochs_trained(tmp_path_factory, digits):
    out = tmp_path_factory.mktemp("two_epochs") / "run"
    assert run(digits, out, "--epochs", "2", "train.keep_checkpoints=2") == 0
    return out


@pytest.fixture
def two_epochs(two_epochs_trained, tmp_path):
    """A run of two epochs (train.keep_checkpoints=2), trained once: each test gets its own copy."""
    out = tmp_path / "run"
    shutil.copytree(two_epochs_trained, out)
    return out


def test_resuming_an_earlier_checkpoint_into_a_later_run_is_refused(two_epochs, digits, capsys, tmp_path):
    """No save replaces a checkpoint of a later position with an earlier one: resuming epoch 1's
    file into the run directory that reached epoch 2 is refused; elsewhere it branches."""
    folder = two_epochs / "checkpoints"
    before = (folder / "last.pt").read_bytes()
    earlier = folder / "epoch_001.pt"
    assert run(digits, two_epochs, "--epochs", "3", "--resume", str(earlier)) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --resume {earlier} is at epoch 1 batch 0, but {folder / 'last.pt'} is further (epoch 2 "
        f"batch 0) and this run would save over it; to branch from {earlier}, pass another --output")
    assert (folder / "last.pt").read_bytes() == before
    assert run(digits, tmp_path / "branch", "--epochs", "3", "--resume", str(earlier)) == 0


def as_modelzoo_saves_it(checkpoint):
    """Our checkpoint as ModelZoo's main.py writes one: its five keys, DDP's 'module.' prefix."""
    return {"epoch": checkpoint["epoch"], "arch": "mobilenet", "best_prec1": checkpoint["best_prec1"],
            "state_dict": {f"module.{k}": v for k, v in checkpoint["state_dict"].items()},
            "optimizer": checkpoint["optimizer"]}


def test_a_modelzoo_checkpoint_resumes_at_its_epoch_with_its_momentum(two_epochs, digits, capsys, tmp_path):
    """--resume of main.py's checkpoint continues where it says (its epoch is the next to train)
    with its best top-1 and SGD momentum: the second epoch ends as the uninterrupted run's did."""
    theirs = tmp_path / "checkpoint.pth.tar"
    first = load_checkpoint(two_epochs / "checkpoints" / "epoch_001.pt")
    for group in first["optimizer"]["param_groups"]:  # its own settings, which this run's replace
        group.update(momentum=0, weight_decay=0.5)
    torch.save(as_modelzoo_saves_it({**first, "best_prec1": 99.5}), theirs)
    capsys.readouterr()
    assert run(digits, tmp_path / "from_theirs", "--epochs", "2", "--resume", str(theirs)) == 0
    said = capsys.readouterr().out
    assert f"resumed from {theirs} (epoch 1, batch 0; global step 4)" in said
    for setting, was, now in (("momentum", 0, 0.9), ("weight_decay", 0.5, 5e-05)):
        assert (f"note: optim.{setting}: the checkpoint's optimizer had {was}, this run's is {now} (config.yaml), "
                f"which it trains with") in said
    assert (f"note: {theirs} is a checkpoint of ModelZoo's main.py: its weights, epoch and best top-1 99.500 are "
            f"taken, not the loss scaler's and the random generators' states (ModelZoo's checkpoints hold "
            f"neither)") in said
    ours, straight = (load_checkpoint(folder / "checkpoints" / "last.pt")
                      for folder in (tmp_path / "from_theirs", two_epochs))
    assert (ours["epoch"], ours["best_prec1"]) == (2, 99.5)
    for key, value in straight["state_dict"].items():
        assert torch.equal(value, ours["state_dict"][key]), key
    capsys.readouterr()
    assert run(digits, tmp_path / "adam", "--epochs", "2", "--resume", str(theirs), "optim.name=adam") == 0
    assert ("taken, not its optimizer state (SGD's momentum, and this run's optimizer is adam) nor the loss "
            "scaler's") in capsys.readouterr().out


def test_a_resume_trains_with_the_settings_it_is_given_and_says_which_differ(two_epochs, digits, capsys):
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "3", "--resume", "auto", "optim.momentum=0.5",
               "optim.weight_decay=0.001", "--optimizer", "fused") == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: optim.")]
    assert said == ["note: optim.momentum: the checkpoint's optimizer had 0.9, this run's is 0.5 (config.yaml), which "
                    "it trains with", "note: optim.weight_decay: the checkpoint's optimizer had 5e-05, this run's is "
                    "0.001 (config.yaml), which it trains with"]
    groups = load_checkpoint(two_epochs / "checkpoints" / "last.pt")["optimizer"]["param_groups"]
    assert [(g["momentum"], g["weight_decay"], g["fused"]) for g in groups] == [(0.5, 0.001, True)]


def test_a_checkpoint_holds_exactly_the_keys_of_their_one_definition(two_epochs):
    """checkpoint.KEYS, which the check of a checkpoint to resume and the note on foreign keys
    read, is what TrainingState.state_dict writes: a key added to one and not the other fails."""
    from mobilenet.checkpoint import KEYS
    assert load_checkpoint(two_epochs / "checkpoints" / "last.pt").keys() == KEYS.keys()


def test_best_and_epoch_files_are_independent_of_last(two_epochs):
    folder = two_epochs / "checkpoints"
    names = {p.name for p in folder.iterdir()}
    assert {"last.pt", "best.pt", "epoch_001.pt", "epoch_002.pt"} <= names
    inodes = {os.stat(folder / name).st_ino for name in ("last.pt", "best.pt", "epoch_002.pt")}
    assert len(inodes) == 3
    corrupt(folder / "last.pt")
    for name in ("best.pt", "epoch_001.pt", "epoch_002.pt"):
        assert load_checkpoint(folder / name)["arch"] == "mobilenet_v1"


def test_resume_auto_skips_a_corrupt_checkpoint_and_says_why(two_epochs, digits, capsys):
    corrupt(two_epochs / "checkpoints" / "last.pt")
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "3", "train.keep_checkpoints=2", "--resume", "auto") == 0
    out = capsys.readouterr().out
    assert "--resume auto: skipping" in out and "last.pt: not a readable checkpoint" in out
    assert "resumed from" in out and "(epoch 2, batch 0; global step 8)" in out
    assert load_checkpoint(two_epochs / "checkpoints" / "last.pt")["epoch"] == 3


def test_resume_auto_stops_when_no_checkpoint_is_valid(two_epochs, digits, capsys):
    folder = two_epochs / "checkpoints"
    for path in folder.glob("*.pt"):
        corrupt(path)
    before = {path: path.read_bytes() for path in [*folder.glob("*.pt"), two_epochs / "config.yaml"]}
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "3", "--resume", "auto") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: --resume auto: no valid checkpoint in")
    assert all(path.read_bytes() == data for path, data in before.items())


def test_resuming_a_finished_run_leaves_its_results(two_epochs, digits, capsys):
    files = [two_epochs / name for name in ("summary.json", "metrics.jsonl", "config.yaml")]
    before = [path.read_bytes() for path in files] + [(two_epochs / "checkpoints" / "last.pt").read_bytes()]
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "2", "train.keep_checkpoints=2", "--resume", "auto") == 0
    assert "is complete: 2 of 2 epochs trained" in capsys.readouterr().out
    after = [path.read_bytes() for path in files] + [(two_epochs / "checkpoints" / "last.pt").read_bytes()]
    assert after == before
    assert json.loads(files[0].read_text())["top1"] > 0


def test_a_second_live_run_on_the_same_output_is_refused(tmp_path, digits, capfd):
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *BASE, "--data", str(digits),
                              "--output", str(out), "--epochs", "50"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in first.stdout:
        if line.startswith("Epoch:"):
            break
    capfd.readouterr()
    assert run(digits, out, "--epochs", "1") == 2
    error = capfd.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"--output {out}: another run is using it (pid {first.pid} on" in error[0]
    first.send_signal(signal.SIGTERM)  # the first run is unharmed: it stops and saves as usual
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 0 and "SIGTERM: stopped" in stdout, stderr[-2000:]


def test_the_lock_of_a_killed_run_and_its_interrupted_save_are_cleaned_up(tmp_path, digits, capsys):
    out = tmp_path / "run"
    killed = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *BASE, "--data", str(digits),
                               "--output", str(out), "--epochs", "50"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    for line in killed.stdout:
        if line.startswith(" * Prec@1"):  # epoch 0 validated; its checkpoint follows
            break
    killed.kill()
    killed.wait()
    stale = out / "checkpoints" / f".last.pt.{killed.pid}.tmp"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"half a checkpoint")  # what a kill -9 inside a save leaves
    capsys.readouterr()
    assert run(digits, out, "--epochs", "2", "--resume", "auto") == 0
    assert f"removed {stale}, left by an interrupted save" in capsys.readouterr().out
    assert not stale.exists() and load_checkpoint(out / "checkpoints" / "last.pt")["epoch"] == 2


@pytest.mark.parametrize("change,message", [
    ("optim.name=adam", "trained with optimizer sgd, this run uses adam"),
    ("optim.norm_weight_decay=0", "parameter groups of [83] tensors, this run's of [29, 54]"),
])
def test_resume_that_cannot_continue_says_what_differs(two_epochs, digits, capsys, change, message):
    config_before = (two_epochs / "config.yaml").read_bytes()
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "3", change, "--resume", "auto") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0] and "model.pretrained=" in error[0]
    assert (two_epochs / "config.yaml").read_bytes() == config_before  # written only once resumable
    fresh = two_epochs.parent / "from_weights"  # the way the message shows
    weights = two_epochs / "checkpoints" / "last.pt"
    assert run(digits, fresh, "--epochs", "1", change, f"model.pretrained={weights}") == 0


def test_evaluate_needs_weights(tmp_path, digits, capsys):
    assert run(digits, tmp_path / "run", "--evaluate") == 2
    assert capsys.readouterr().err.strip() == ("error: --evaluate needs weights: --resume FILE or "
                                               "model.pretrained=FILE")


FULL_AT_SAVE = """
{python} {train} {args} --output {mount}/run --epochs 3
echo "exit $?"
ls -a {mount}/run/checkpoints
cp -r {mount}/run/checkpoints {copy}
"""


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, digits):
    """A tmpfs that holds the first epoch's last.pt and best.pt but not the temporary file of the
    next save: exit 1 (a failure during training), one line, the previous last.pt intact."""
    sizing = tmp_path / "sizing"
    assert run(digits, sizing, "--epochs", "1") == 0
    checkpoint = (sizing / "checkpoints" / "last.pt").stat().st_size
    args = " ".join([*BASE, "--data", str(digits), "train.log_every=100"])
    mount, result = in_small_tmpfs(tmp_path, int(2.5 * checkpoint) + 65536, FULL_AT_SAVE, args=args,
                                   copy=tmp_path / "copy")
    assert "exit 1" in result.stdout, result.stdout + result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert error == [f"error: {mount}/run/checkpoints/last.pt: cannot save the checkpoint (No space "
                     f"left on device); the previous last.pt is intact"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not [name for name in result.stdout.split() if name.endswith(".tmp")]  # cleaned up
    assert load_checkpoint(tmp_path / "copy" / "last.pt")["epoch"] == 1


FULL_AT_START = """
dd if=/dev/zero of={mount}/filler bs=64k 2>/dev/null
{python} {train} {args} --output {mount}/run
echo "exit $?"
"""

FILLS_MID_RUN = """
{python} {train} {args} --output {mount}/run > {logs}/log 2>{logs}/err &
until grep -qs "Epoch: \\[{epoch}\\]\\[2/" {logs}/log; do sleep 0.05; done
dd if=/dev/zero of={mount}/filler bs=4k 2>/dev/null
wait $!
echo "exit $?"
cat {logs}/err >&2
"""


@pytest.mark.parametrize("when", ["at start", "before any save", "after a save"])
def test_a_full_disk_before_or_between_saves_is_one_line(tmp_path, digits, when):
    """Already full when the run starts (the run lock): a usage error, exit 2. Filled while it
    trains (the next metrics.jsonl lines; its last page's room holds a few more), in the first epoch
    or after its save: exit 1, one line that says which, the checkpoints intact. No traceback."""
    args = " ".join([*BASE, "--data", str(digits), "train.log_every=1", "data.batch_size=16",
                     "train.max_steps_per_epoch=0",
                     "--epochs", "2"])
    mount, result = in_small_tmpfs(tmp_path, 4 << 20, FULL_AT_START if when == "at start" else FILLS_MID_RUN,
                                   args=args, logs=tmp_path, epoch=0 if when == "before any save" else 1)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(errors) == 1, result.stdout[-2000:] + result.stderr[-3000:]
    if when == "at start":
        assert "exit 2" in result.stdout
        assert errors[0] == (f"error: --output {mount}/run: cannot write there (No space left on device); "
                             f"free some space or pass another --output")
        return
    saved = ("no checkpoint had been saved yet" if when == "before any save"
             else "the checkpoints saved before are intact")
    assert "exit 1" in result.stdout
    assert errors[0] == (f"error: {mount}/run/metrics.jsonl: cannot write the metrics (No space left on device); "
                         f"stopped, {saved}; free some space and resume with --resume auto"), errors[0]


def test_resume_auto_picks_by_position_and_skips_weights_files(two_epochs, digits, capsys):
    """An older epoch file touched later, and a bare weights file, must not be resumed."""
    folder = two_epochs / "checkpoints"
    os.utime(folder / "epoch_001.pt")  # newer by file time, older by position
    torch.save({"state_dict": load_checkpoint(folder / "last.pt")["state_dict"]}, folder / "weights.pt")
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "2", "train.keep_checkpoints=2", "--resume", "auto") == 0
    out = capsys.readouterr().out
    assert "weights.pt: weights only, no training state" in out
    assert "is complete: 2 of 2 epochs trained" in out


def test_evaluate_resume_auto_without_a_checkpoint_is_an_error(tmp_path, digits, capsys):
    assert run(digits, tmp_path / "empty", "--evaluate", "--resume", "auto") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: --evaluate --resume auto: no checkpoint in")


def test_resume_with_another_batch_keeps_the_global_batch_or_says_what_changes(two_epochs, digits, capsys):
    """Another data.batch_size: the checkpoint's global batch is kept (two forwards a step), mid-epoch
    too; another global batch given: at an epoch's end a note says so, mid-epoch it is refused."""
    mid = two_epochs.parent / "mid"
    assert run(digits, mid, "--epochs", "2", "train.max_steps=6") == 0  # stops at epoch 1, batch 2
    assert load_checkpoint(mid / "checkpoints" / "last.pt")["epoch_step"] == 2
    capsys.readouterr()
    assert run(digits, mid, "--epochs", "2", "data.batch_size=16", "data.global_batch=16", "--resume", "auto") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "stopped mid-epoch (epoch 1, batch 2) at global batch 32; this run's is 16" in error[0]
    assert "train.resume_next_epoch=true" in error[0]
    assert run(digits, mid, "--epochs", "2", "data.batch_size=16", "--resume", "auto") == 0
    assert ("note: the checkpoint trained with 1 process(es) x data.batch_size 32 x 1 forward(s) = global batch 32, "
            "lr 0.1; this run has 1 x 16 x 2 = 32, lr 0.1, the same global batches") in capsys.readouterr().out
    assert run(digits, two_epochs, "--epochs", "3", "data.global_batch=16", "data.batch_size=16",
               "--resume", "auto") == 0
    assert ("this run has 1 x 16 x 1 = 16, lr 0.1, and so another data order") in capsys.readouterr().out


def test_a_resume_trains_at_its_own_lr_from_its_own_position_in_the_schedule(digits, tmp_path, capsys):
    """The LR a resume trains with is this run's: optim.lr as given, and at another global batch
    (11 steps an epoch at 128, 5 at 256) the schedule's position in this run's steps, as a fresh
    run at 256 has it; a run stopped mid-epoch goes on at another global batch with
    train.resume_next_epoch (from the next epoch's first step)."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    at_128 = ["train.max_steps_per_epoch=0", "data.batch_size=128"]
    assert run(digits, whole, *at_128, "--epochs", "1") == 0
    assert run(digits, cut, *at_128, "--epochs", "2", "train.max_steps=3") == 0
    at_256 = ["train.max_steps_per_epoch=0", "data.batch_size=256", "--epochs", "3", "--resume", "auto"]
    assert run(digits, cut, *at_256, "train.max_steps=4") == 2
    assert "stopped mid-epoch at global batch 128" in capsys.readouterr().err
    for out, extra in ((whole, ["optim.lr=0.05", "train.max_steps=12"]),  # one step more
                       (cut, ["train.resume_next_epoch=true", "train.max_steps=4"])):
        capsys.readouterr()
        assert run(digits, out, *at_256, *extra) == 0
        checkpoint = load_checkpoint(out / "checkpoints" / "last.pt")
        lr = 0.05 if out == whole else 0.1
        assert checkpoint["scheduler"]["base_lrs"] == [lr], capsys.readouterr().out
        assert checkpoint["scheduler"]["last_epoch"] == 5 + 1  # epoch 1 of 5 steps, and its first step
        assert [g["initial_lr"] for g in checkpoint["optimizer"]["param_groups"]] == [lr]


def test_a_crash_in_the_last_validation_is_validated_on_resume(tmp_path, digits):
    """A save of the last step (train.checkpoint_every_minutes), then kill -9 during the final
    validation: the resume validates the trained epoch and writes what a finished run leaves."""
    out = tmp_path / "run"
    args = [sys.executable, "train.py", *BASE, "--data", str(digits), "--output", str(out), "--epochs", "1",
            "train.log_every=1", "train.checkpoint_every_minutes=0.00001", "data.val_batch_size=1"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("Epoch: [0][4/4]"):  # the save of that step follows the line
            break
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(Exception):  # not there yet, or being replaced
            if load_checkpoint(out / "checkpoints" / "last.pt")["epoch_step"] == 4:
                proc.kill()
                break
    proc.communicate(timeout=60)
    saved = load_checkpoint(out / "checkpoints" / "last.pt")
    assert (saved["epoch"], saved["epoch_step"], saved["validated"]) == (0, 4, False)
    assert not (out / "summary.json").exists() and not (out / "checkpoints" / "best.pt").exists()
    resumed = subprocess.run([*args, "--resume", "auto"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert " * Prec@1" in resumed.stdout and "Epoch:" not in resumed.stdout  # validated, nothing trained again
    assert json.loads((out / "summary.json").read_text())["epochs"] == 1
    assert (out / "checkpoints" / "best.pt").exists()
    assert load_checkpoint(out / "checkpoints" / "last.pt")["epoch"] == 1


def test_a_run_is_not_trained_over_unless_asked(two_epochs, digits, capsys):
    before = (two_epochs / "checkpoints" / "last.pt").read_bytes()
    capsys.readouterr()
    assert run(digits, two_epochs, "--epochs", "1") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "holds a run" in error[0] and "--resume auto" in error[0] and "--start-over" in error[0]
    assert (two_epochs / "checkpoints" / "last.pt").read_bytes() == before
    assert run(digits, two_epochs, "--epochs", "1", "--start-over") == 0
    records = [json.loads(line) for line in (two_epochs / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "val"] == [0]  # the old run's records are gone
    assert not (two_epochs / "checkpoints" / "epoch_002.pt").exists()


def copy_of(digits, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(digits, data)
    return data


def test_data_that_changed_under_a_mid_epoch_stop_is_refused_or_said(tmp_path, digits, capsys):
    """The checkpoint records what the data was; a resume mid-epoch on other data is refused (it
    would continue another epoch), with a way to go on; where it can continue it says what changed."""
    data, out = copy_of(digits, tmp_path), tmp_path / "run"
    assert run(data, out, "--epochs", "2", "train.max_steps=6") == 0  # stops at epoch 1, batch 2
    recorded = load_checkpoint(out / "checkpoints" / "last.pt")["data"]
    assert recorded["train"]["images"] == 1437 and len(recorded["train"]["fingerprint"]) == 40
    removed = sorted((data / "train" / "3").iterdir())
    for path in removed[: len(removed) // 2]:
        path.unlink()
    capsys.readouterr()
    assert run(data, out, "--epochs", "2", "--resume", "auto") == 2
    error = capsys.readouterr().err.strip().splitlines()
    kept = 1437 - len(removed) // 2
    assert len(error) == 1 and (f"stopped mid-epoch (epoch 1, batch 2) on other data (train: 1437 images then, "
                                f"{kept} now)") in error[0] and "train.resume_next_epoch=true" in error[0]
    assert run(data, out, "--epochs", "3", "--resume", "auto", "train.resume_next_epoch=true") == 0
    said = capsys.readouterr().out
    assert f"note: the data changed since the checkpoint: train: 1437 images then, {kept} now" in said
    assert "train.resume_next_epoch: the rest of epoch 1 (from batch 2) is skipped; training goes on at epoch 2" in said
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert (state["epoch"], state["epoch_step"]) == (3, 0) and state["data"]["train"]["images"] == kept


def test_records_keep_their_global_steps_when_the_epoch_shrinks(tmp_path, digits):
    """Global steps are counted, not derived from the epoch length: after the train set shrinks and
    train.resume_next_epoch goes on, the interrupted epoch's records stay and no step number is reused."""
    data, out = copy_of(digits, tmp_path), tmp_path / "run"
    shrink = ["data.batch_size=128", "train.max_steps_per_epoch=0"]  # 11 steps an epoch, then 5
    assert run(data, out, "--epochs", "3", "train.max_steps=20", *shrink) == 0  # epoch 1, batch 9
    for folder in (data / "train").iterdir():
        for path in sorted(folder.iterdir())[::2]:
            path.unlink()
    assert run(data, out, "--epochs", "3", "--resume", "auto", "train.resume_next_epoch=true", *shrink) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for kind in ("train", "val"):
        steps = [r["global_step"] for r in records if r["kind"] == kind]
        assert steps == sorted(set(steps)), (kind, steps)  # none lost, none reused
    assert [r["global_step"] for r in records if r["kind"] == "val"] == [11, 20, 25]
    assert load_checkpoint(out / "checkpoints" / "last.pt")["global_step"] == 25


def test_a_checkpoint_without_a_data_record_resumes_with_a_note(tmp_path, digits, capsys):
    out = tmp_path / "run"
    assert run(digits, out, "--epochs", "2", "train.max_steps=6") == 0
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    del state["data"]  # as main before the record wrote them
    torch.save(state, out / "checkpoints" / "last.pt")
    capsys.readouterr()
    assert run(digits, out, "--epochs", "2", "--resume", "auto") == 0
    assert "whether the data changed could not be checked" in capsys.readouterr().out


@pytest.mark.parametrize("key,value,expected", [("epoch", "1", "a whole number"), ("epoch_step", -3, "a whole number"),
                                                ("best_prec1", None, "a number"), ("rng", [], "random generators")])
def test_a_malformed_field_is_not_a_checkpoint_this_app_can_resume(two_epochs, digits, capsys, tmp_path, key,
                                                                   value, expected):
    state = load_checkpoint(two_epochs / "checkpoints" / "last.pt")
    state[key], state["mystery"] = value, 1
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    capsys.readouterr()
    assert run(digits, tmp_path / "resumed", "--epochs", "3", "--resume", str(path)) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"not a checkpoint this app can resume: its '{key}' is" in error[0]
    assert expected in error[0] and "model.pretrained=" in error[0]


def test_unknown_keys_are_said_and_numpy_values_refused_in_plain_words(two_epochs, digits, capsys, tmp_path):
    import numpy as np
    state = load_checkpoint(two_epochs / "checkpoints" / "last.pt")
    state["mystery"] = 1
    torch.save(state, tmp_path / "extra.pt")
    capsys.readouterr()
    assert run(digits, tmp_path / "a", "--epochs", "3", "--resume", str(tmp_path / "extra.pt")) == 0
    assert "note: the checkpoint's keys mystery are not this app's; ignored" in capsys.readouterr().out
    state["epoch"] = np.int64(2)
    torch.save(state, tmp_path / "numpy.pt")
    assert run(digits, tmp_path / "b", "--epochs", "3", "--resume", str(tmp_path / "numpy.pt")) == 2
    error = capsys.readouterr().err.strip()
    assert "\x1b" not in error and error.endswith("save its tensors and numbers as plain values")
    assert "holds a numpy." in error and len(error.splitlines()) == 1


def test_a_bug_writes_its_traceback_to_the_run_directory_and_one_line(tmp_path, digits, capsys, monkeypatch):
    """What no test could make happen otherwise: an error the app does not know, raised inside a
    run, as a bug would be (injected into the loop's step)."""
    from mobilenet import state

    def broken(self, batches, after_each=None):
        raise ZeroDivisionError("injected")
    monkeypatch.setattr(state.TrainingState, "train_on", broken)
    out = tmp_path / "run"
    assert run(digits, out, "--epochs", "1") == 1
    error = capsys.readouterr().err.strip().splitlines()
    path = out / "traceback-rank0.txt"
    assert error == [f"error: unexpected ZeroDivisionError: injected (a bug, or a failure the app does not "
                     f"handle; traceback in {path})"]
    assert "in broken" in path.read_text() and "in train_one_epoch" in path.read_text()
    assert path.read_text().strip().endswith("ZeroDivisionError: injected")


def test_a_run_directory_from_before_the_renamed_keys_resumes_and_is_trimmed_right(tmp_path, digits, capsys):
    """Checkpoints once held the step within the epoch as 'step', metrics.jsonl the global step
    as 'step': such a run resumes mid-epoch, and its records after the checkpoint go."""
    out, straight = tmp_path / "old", tmp_path / "straight"
    assert run(digits, straight, "--epochs", "2", "train.log_every=2") == 0
    assert run(digits, out, "--epochs", "2", "train.log_every=2", "train.max_steps=6") == 0
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    state["step"] = state.pop("epoch_step")
    torch.save(state, out / "checkpoints" / "last.pt")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records.append({**records[0], "global_step": 7})  # written after the checkpoint, trained again
    old = [{("step" if key == "global_step" else key): value for key, value in r.items()} for r in records]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    (out / "summary.json").unlink()
    capsys.readouterr()
    assert run(digits, out, "--epochs", "2", "train.log_every=2", "--resume", "auto") == 0
    assert "(epoch 1, batch 2; global step 6)" in capsys.readouterr().out  # 4 steps an epoch (BASE)
    positions = [(r["kind"], r.get("global_step", r.get("step"))) for r in
                 map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    expected = [(r["kind"], r["global_step"]) for r in
                map(json.loads, (straight / "metrics.jsonl").read_text().splitlines())]
    assert [p for p in positions if p != ("val", 6)] == expected  # the cut run validated at 6
    a, b = (load_checkpoint(d / "checkpoints" / "last.pt")["state_dict"] for d in (out, straight))
    assert all(torch.equal(a[k], b[k]) for k in b)
