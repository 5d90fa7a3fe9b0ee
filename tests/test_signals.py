"""Graceful stop whatever receives the signal, with real DataLoader worker processes: the run
finishes its step, all ranks agree, last.pt is saved, the workers exit 0, and the resumed run
ends bit-identical to an uninterrupted one."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from conftest import (ROOT, TINY, TWO_RANKS, as_from_a_shell, assert_same_weights, process_tree, start_two_ranks,
                      train_sh)
from mobilenet.checkpoint import load_checkpoint

DEMO = ["--config", "configs/demo.yaml", *TINY, "data.workers=2", "train.log_every=2",
        "--epochs", "2", "--optimizer", "fused"]


@pytest.fixture(scope="module")
def straight_demo(digits, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    assert train.main([*DEMO, "--data", str(digits), "--output", str(out)]) == 0
    return out


def start_demo(digits, out, *extra):
    """python train.py on the demo in a session of its own (as a terminal's job: Ctrl-C reaches
    the group); text pipes."""
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *DEMO, "--data", str(digits),
                             "--output", str(out), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_shell)


@pytest.mark.parametrize("delivery", ["process", "process group"])
def test_sigterm_mid_epoch_then_resume_is_bit_identical(tmp_path, digits, straight_demo, delivery):
    out = tmp_path / "interrupted"
    proc = start_demo(digits, out)
    for line in proc.stdout:
        if line.startswith("Epoch: [0][10/"):
            assert len(process_tree(proc.pid)) == 3  # the run and its 2 train loader workers
            if delivery == "process":
                proc.send_signal(signal.SIGTERM)
            else:  # what `timeout`, a shell's job control or a container runtime does
                os.killpg(proc.pid, signal.SIGTERM)
            break
    rest, errors = proc.communicate(timeout=120)
    assert proc.returncode == 0, errors[-2000:]
    assert "SIGTERM: stopped at epoch 0 batch" in rest and "--resume auto" in rest
    assert "Traceback" not in errors
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["epoch"] == 0 and 10 <= state["epoch_step"] < 44
    assert not (out / "summary.json").exists()

    assert train.main([*DEMO, "--data", str(digits), "--output", str(out), "--resume", "auto"]) == 0
    assert_same_weights(straight_demo, out)
    val = [[r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "val"] for run in (straight_demo, out)]
    assert [(r["top1"], r["top5"]) for r in val[0]] == [(r["top1"], r["top5"]) for r in val[1]]


@pytest.mark.parametrize("delivery", ["torchrun", "every process"])
def test_sigterm_to_torchrun_or_every_process_stops_all_ranks_together(tmp_path, straight_two_ranks,
                                                                         delivery):
    out = tmp_path / "run"
    proc = start_two_ranks(out)
    for line in proc.stdout:
        if re.match(r"Epoch: \[0\]\[6/", line):
            tree = process_tree(proc.pid)
            assert len(tree) == 1 + 2 * 3  # torchrun, 2 ranks with 2 train loader workers each
            # torchrun passes TERM on to each rank's process group; Slurm signals every process
            for pid in ([proc.pid] if delivery == "torchrun" else tree):
                os.kill(pid, signal.SIGTERM)
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert "SIGTERM: stopped at epoch 0 batch" in stdout, stderr[-2000:]
    assert stdout.count("stopped at epoch") == 1
    # the launcher's line comes last and the exit code says the run saved; no traceback anywhere
    assert stderr.strip().splitlines()[-1].startswith("SIGTERM: every worker on this node stopped cleanly")
    assert proc.returncode == 0, stderr[-3000:]
    assert not re.search(r"Traceback|killed by signal|exitcode", stderr), stderr[-3000:]
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["epoch"] == 0 and 6 <= state["epoch_step"] < 40
    resumed = train_sh(*TWO_RANKS, "--output", out, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(out / "checkpoints" / "last.pt")["epoch"] == 1
    assert_same_weights(straight_two_ranks, out)


def test_sighup_with_the_terminal_gone_saves_and_resumes_bit_identical(tmp_path, digits, straight_demo):
    """A closed terminal: SIGHUP to the foreground group, and every later print fails."""
    out = tmp_path / "hangup"
    proc = start_demo(digits, out)
    for line in proc.stdout:
        if line.startswith("Epoch: [0][10/"):
            break
    proc.stdout.close()
    os.killpg(proc.pid, signal.SIGHUP)
    errors = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, errors[-2000:]
    assert "Traceback" not in errors
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["epoch"] == 0 and 10 <= state["epoch_step"] < 44
    assert train.main([*DEMO, "--data", str(digits), "--output", str(out), "--resume", "auto"]) == 0
    assert_same_weights(straight_demo, out)


def test_steps_replayed_after_a_kill_are_recorded_once(tmp_path, digits, straight_demo):
    """kill -9 in epoch 1: the resume replays epoch 1 from its start; metrics.jsonl and TensorBoard
    keep one record per step, as an uninterrupted run has them."""
    out = tmp_path / "killed"
    proc = start_demo(digits, out)
    for line in proc.stdout:
        if line.startswith("Epoch: [1][10/"):
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.communicate(timeout=60)
    assert train.main([*DEMO, "--data", str(digits), "--output", str(out), "--resume", "auto"]) == 0
    steps = [[(r["kind"], r["global_step"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
             for run in (straight_demo, out)]
    assert steps[1] == steps[0]
    events = []
    for run in (straight_demo, out):
        accumulator = EventAccumulator(str(run))
        accumulator.Reload()
        events.append([event.step for event in accumulator.Scalars("train/loss")])
    assert events[1] == events[0]


def test_resume_auto_without_a_checkpoint_drops_the_records_it_trains_again(tmp_path, digits):
    """A restart before the first save (no checkpoint yet) starts at step 0: the records of the
    round that died go, so every step is recorded once."""
    out = tmp_path / "run"
    short = [*DEMO, "--data", str(digits), "--output", str(out), "--epochs", "1", "train.max_steps_per_epoch=10"]
    assert train.main(short) == 0
    shutil.rmtree(out / "checkpoints")  # as if it died before its first save
    (out / "summary.json").unlink()
    assert train.main([*short, "--resume", "auto"]) == 0
    steps = [json.loads(line)["global_step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps


def test_sighup_stays_ignored_under_nohup(tmp_path, digits):
    out = tmp_path / "nohup"
    args = [sys.executable, str(ROOT / "train.py"), *DEMO, "--data", str(digits), "--output", str(out),
            "train.max_steps_per_epoch=20"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    for line in proc.stdout:
        if line.startswith("Epoch: [0][10/"):
            os.killpg(proc.pid, signal.SIGHUP)  # the run and its loader workers
            break
    rest, errors = proc.communicate(timeout=300)
    assert proc.returncode == 0, errors[-2000:]
    assert "stopped" not in rest and json.loads((out / "summary.json").read_text())["epochs"] == 2


@pytest.mark.parametrize("sig, gap", [(signal.SIGTERM, 0.05), (signal.SIGINT, 0.05), (signal.SIGTERM, 0.3)])
def test_two_signals_in_a_row_save_once_and_exit_zero(tmp_path, digits, sig, gap):
    """A second signal while the run stops and saves (or while the process ends) is ignored:
    the save completes, exit code 0, the stop line once, nothing on stderr."""
    proc = start_demo(digits, tmp_path / "run", "data.batch_size=8", "train.log_every=1")
    for line in proc.stdout:
        if line.startswith("Epoch: [0][10/"):
            os.killpg(proc.pid, sig)
            time.sleep(gap)
            os.killpg(proc.pid, sig)
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0 and stderr == "", stderr[-3000:]
    assert stdout.count(f"{sig.name}: stopped at epoch 0 batch") == 1
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["epoch_step"] >= 10


def start_up_handlers(pid, timeout=30):
    """Waits until process ``pid`` catches SIGTERM (Python alone catches only SIGINT): train.py's
    start-up handlers are in place. Returns its signal masks from /proc, for a failure's message."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(re.search(r"SigCgt:\s*([0-9a-f]+)", status).group(1), 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            return "".join(line + "\n" for line in status.splitlines() if line.startswith("Sig"))
        time.sleep(0.01)
    raise AssertionError(f"process {pid} installed no SIGTERM handler within {timeout} s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_start_up_is_one_line(tmp_path, digits, sig):
    """Ctrl-C (or a TERM) while torch loads or the run is built: one line, exit 128 + the signal's
    number, nothing written."""
    proc = start_demo(digits, tmp_path / "run", "train.log_every=1")
    status = start_up_handlers(proc.pid)  # torch and the run take seconds more to load
    os.killpg(proc.pid, sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig.value, stdout[-2000:] + stderr[-3000:] + status
    assert stderr.splitlines() == [f"{sig.name}: stopped, nothing saved now (checkpoints written before "
                                   f"stay valid)"], stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()


def workers(root):
    """The torchrun workers under ``root`` (their environment has LOCAL_RANK)."""
    found = []
    for pid in process_tree(root):
        try:
            if b"LOCAL_RANK=" in open(f"/proc/{pid}/environ", "rb").read():
                found.append(pid)
        except OSError:
            continue
    return found


def test_ctrl_c_during_start_up_under_torchrun_is_one_line(tmp_path):
    """Ctrl-C (SIGINT to the group) while two workers load: one line from the launcher, exit 130;
    torchrun's own log lines aside, nothing else on stderr."""
    proc = subprocess.Popen(["bash", "train.sh", *TWO_RANKS, "--output", str(tmp_path / "run")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_shell)
    deadline = time.monotonic() + 60
    while len(workers(proc.pid)) < 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    ours = [line for line in stderr.splitlines() if not re.match(r"[WIE]\d{4} |\*+$", line)]
    assert proc.returncode == 130, stderr[-3000:]
    assert ours == ["SIGINT: stopped, nothing saved now (checkpoints written before stay valid)"], stderr[-3000:]
    assert "Epoch:" not in stdout


def test_a_signal_during_an_atomic_write_leaves_no_temporary_file(tmp_path):
    """SIGTERM in start-up ends the process at once (errors.exit_at_once); a file half-written
    through its temporary name (config.yaml, a checkpoint) must not stay behind."""
    code = f"""
import os, signal
from pathlib import Path
from mobilenet import checkpoint
from mobilenet.errors import exit_at_once
signal.signal(signal.SIGTERM, exit_at_once)
def write(self, data):
    os.kill(os.getpid(), signal.SIGTERM)  # arrives while the temporary file is open
    return len(data)
import io
checkpoint.open = lambda path, mode: type("F", (io.FileIO,), {{"write": write}})(path, mode)
checkpoint.save_atomic(b"x" * 10, Path({str(tmp_path / "config.yaml")!r}), "the config")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert list(tmp_path.iterdir()) == []
