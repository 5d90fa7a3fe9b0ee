"""A rank or a loader worker that stops (SIGSTOP, as a dead network file system or a hung card
leaves it): the stall watchdog ends the job with one line that names it; a stop signal during such
a wait is acted on at once; a second one always ends the process; a peer's death is not a bug."""
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, as_from_a_shell, free_port, process_tree
from mobilenet.checkpoint import load_checkpoint
from mobilenet.watchdog import PUBLISH_EVERY_S
from test_cluster import kill_rank_1_mid_epoch

DEMO = ["--config", "configs/demo.yaml", "device=cpu", "data.cache_mb=0", "data.workers=1",
        "train.log_every=1", "--epochs", "30"]


def start(out, digits, *extra, env=None):
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *DEMO, "--data", str(digits),
                             "--output", str(out), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_shell, env=env)


def wait_for_steps(proc, text="Epoch: [0][3/"):
    for line in proc.stdout:
        if line.startswith(text):
            return
    raise AssertionError(f"no {text!r}: {proc.stderr.read()[-2000:]}")


def until_quiet(proc, seconds=0.5, limit=30):
    """Reads ``proc``'s output until it prints nothing for ``seconds``: its loop waits (for a stopped
    worker or rank) instead of making steps."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not select.select([proc.stdout], [], [], seconds)[0]:
            return
        if not proc.stdout.readline():
            raise AssertionError(f"the process ended: {proc.stderr.read()[-2000:]}")
    raise AssertionError(f"still printing after {limit} s")


def stop_the_loader_worker(proc):
    workers = [pid for pid in process_tree(proc.pid) if pid != proc.pid]
    assert len(workers) == 1, workers
    os.kill(workers[0], signal.SIGSTOP)
    return workers[0]


def started(pid):
    """When process ``pid`` started (clock ticks since boot)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def gone(pid, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_a_stuck_loader_worker_is_named_and_the_run_ends(tmp_path, digits):
    proc = start(tmp_path / "run", digits, "train.stall_timeout=4")
    wait_for_steps(proc)
    worker = stop_the_loader_worker(proc)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    line = stderr.strip().splitlines()[-1]
    waited = re.match(r"error: rank 0 made no progress for (\d+) s \(train.stall_timeout 4\)", line)
    assert waited and int(waited.group(1)) >= 4, line
    assert f"waits for a batch from the data loader; loader worker pid {worker} is stopped" in line
    assert "stay valid (resume with --resume auto)" in line
    assert gone(worker)  # not left stopped behind


def test_a_paused_job_is_not_a_stalled_one(tmp_path, digits):
    """Ctrl-Z then fg, Slurm's suspend and resume, a frozen container: the whole job stops (its
    loader worker too) for twice train.stall_timeout, then goes on and ends as it would
    have."""
    proc = start(tmp_path / "run", digits, "train.stall_timeout=2", "--epochs", "2")
    wait_for_steps(proc, "Epoch: [0][10/")
    os.killpg(proc.pid, signal.SIGSTOP)
    time.sleep(4)
    os.killpg(proc.pid, signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    assert "Prec@1" in stdout and (tmp_path / "run" / "summary.json").exists()


SAVES = """
import time
from mobilenet.distributed import World
from mobilenet.watchdog import Watchdog
with Watchdog(1.0, World(), None, "checkpoints") as watchdog:
    watchdog.beat(7)
    for name in ("last.pt", "best.pt", "epoch_003.pt"):  # each shorter than the timeout, all longer
        with watchdog.writing(name):
            time.sleep(0.6)
    print("saved", flush=True)
    with watchdog.writing("summary.json"):  # a write that does not return
        time.sleep(30)
"""


def test_each_save_is_progress_and_a_save_that_hangs_is_named():
    result = subprocess.run([sys.executable, "-c", SAVES], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stdout == "saved\n", result.stderr
    assert re.fullmatch(r"error: rank 0 made no progress for \d s \(train.stall_timeout 1\) after global step 7: it is "
                        r"writing summary.json and the write does not return \(a hung or very slow file system\?\); "
                        r"the job stops, the checkpoints in checkpoints stay valid \(resume with --resume auto\)",
                        result.stderr.strip()), result.stderr


def test_the_last_line_says_what_happened_first():
    """The launcher's last line (launch.likely_cause), from what the workers said and how they ended."""
    from mobilenet.launch import likely_cause
    stall = (1, "error: rank 0 made no progress for 11 s (train.stall_timeout 6) after global step 19: rank 1 "
                "has not answered for 11 s (stopped or gone) at global step 19 or the one before ...")
    peer = (1, "error: rank 0: another process of the job ended while this one waited for it (...)")
    # a hung rank: rank 0's watchdog ends the job, torchrun kills rank 1 after its grace period
    assert likely_cause({0: 1, 1: "SIGKILL"}, {0: stall}) == stall
    # rank 1 killed first (the OOM killer, kill -9): rank 0 only says that a process of the job ended
    assert likely_cause({0: 1, 1: "SIGKILL"}, {0: peer})[1].startswith("error: rank 1 was killed by SIGKILL")
    # a crash is its own cause, whatever the others said after it
    assert likely_cause({0: 1, 1: "SIGSEGV"}, {0: stall})[1].startswith("error: rank 1 was killed by SIGSEGV")


def test_a_stop_signal_while_a_worker_is_stuck_saves_at_once(tmp_path, digits):
    out = tmp_path / "run"
    proc = start(out, digits, "train.stall_timeout=0")
    wait_for_steps(proc)
    worker = stop_the_loader_worker(proc)
    until_quiet(proc)  # the batches the loader had ready are trained: the wait has begun, not yet 5 s long
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    line = [entry for entry in stdout.splitlines() if entry.startswith("SIGTERM: stopped at epoch 0 batch")]
    assert line and "saved" in line[0], stdout[-2000:]
    step = int(line[0].split("batch ")[1].split(",")[0])
    assert load_checkpoint(out / "checkpoints" / "last.pt")["epoch_step"] == step
    assert gone(worker)


def start_modelzoo_ranks(out, digits, *extra, count=2):
    """``count`` processes of a --distributed job, started as ModelZoo's 8-card script starts its own."""
    env = {**os.environ, "RANK_SIZE": str(count), "MASTER_PORT": str(free_port())}
    return [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *DEMO, "data.workers=0", "--data",
                              str(digits), "--output", str(out), "--distributed", *extra], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             preexec_fn=as_from_a_shell, env={**env, "RANK_ID": str(rank)})
            for rank in range(count)]


def test_a_stop_signal_while_one_ranks_worker_is_stuck_stops_every_rank_after_one_step(tmp_path, digits):
    """Rank 1's loader worker stops; SIGTERM to the job: rank 1 leaves its stuck wait and votes in
    the reduction rank 0 waits in before its next step, so both stop after the same step, rank 0
    saves it and both exit 0 (before, rank 1 left alone, unsaved, and rank 0 failed)."""
    out = tmp_path / "run"
    ranks = start_modelzoo_ranks(out, digits, "train.stall_timeout=0", "data.workers=1")
    try:
        wait_for_steps(ranks[0])
        worker = stop_the_loader_worker(ranks[1])
        until_quiet(ranks[0])  # the batches rank 1's loader had ready are trained: both ranks wait
        for proc in ranks:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=60) for proc in ranks]
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in ranks] == [0, 0], [stderr[-2000:] for _, stderr in outputs]
    line = [entry for entry in outputs[0][0].splitlines() if entry.startswith("SIGTERM: stopped at epoch 0 batch")]
    assert line and "saved" in line[0], outputs[0][0][-2000:]
    saved = load_checkpoint(out / "checkpoints" / "last.pt")
    assert saved["epoch_step"] == int(line[0].split("batch ")[1].split(",")[0])
    assert gone(worker)


def test_a_stopped_rank_is_named_by_the_others(tmp_path, digits):
    """Three ranks, rank 1 stopped: the others name rank 1 (the step it stopped at, where they
    wait), never each other: rank 0 and rank 2 are alive and wait alike. (The first of them whose
    watchdog fires ends the job; the other may then say that a process of the job ended.)"""
    ranks = start_modelzoo_ranks(tmp_path / "run", digits, "train.stall_timeout=6", count=3)
    try:
        wait_for_steps(ranks[0], "Epoch: [1][5/")  # after the ranks' first progress reports
        os.kill(ranks[1].pid, signal.SIGSTOP)
        lines = [ranks[rank].communicate(timeout=90)[1].strip().splitlines()[-1] for rank in (0, 2)]
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert ranks[0].returncode == ranks[2].returncode == 1, lines
    named = [re.fullmatch(r"error: rank [02] made no progress for \d+ s \(train.stall_timeout 6\) after global "
                          r"step (\d+): rank 1 has not answered for \d+ s \(stopped or gone\) at global step (\d+) "
                          r"or the one before \(its last report: global step \d+\); the others wait for it( \(as "
                          r"rank [02] found, which ended first\))?; the job stops, .*", line) for line in lines]
    assert any(named), lines
    for found, line in zip(named, lines):
        assert found or "another process of the job ended" in line, line


def test_a_slow_but_healthy_rank_in_validation_is_waited_for(tmp_path, digits):
    """Rank 1's validation crawls (its loader workers stopped for 1 s at a time, for longer than
    train.stall_timeout and the watchdog's decision in all) while rank 0 waits for it: rank 1
    makes progress, so the job goes on."""
    ranks = start_modelzoo_ranks(tmp_path / "run", digits, "train.stall_timeout=3", "data.workers=1", "--epochs", "2",
                                 "train.max_steps_per_epoch=6", "data.val_batch_size=1")
    try:
        wait_for_steps(ranks[0], "Epoch: [1][1/6]")  # the validation loader's worker exists from epoch 0 on
        val_worker = max(process_tree(ranks[1].pid)[1:], key=started)  # started after the training one's
        os.kill(val_worker, signal.SIGSTOP)
        # longer than the watchdog takes to fire (3 s) and to decide (2.5 x PUBLISH_EVERY_S), with room
        deadline = time.monotonic() + 3 + 2.5 * PUBLISH_EVERY_S + 3
        while time.monotonic() < deadline and ranks[1].poll() is None:
            time.sleep(1)
            os.kill(val_worker, signal.SIGCONT)
            time.sleep(0.02)
            os.kill(val_worker, signal.SIGSTOP)
        os.kill(val_worker, signal.SIGCONT)
        outputs = [proc.communicate(timeout=60) for proc in ranks]
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in ranks] == [0, 0], [stderr[-1500:] for _, stderr in outputs]
    assert " * Prec@1" in outputs[0][0]


def test_a_second_ctrl_c_ends_a_rank_blocked_in_a_collective(tmp_path, digits):
    ranks = start_modelzoo_ranks(tmp_path / "run", digits, "train.stall_timeout=0")
    try:
        wait_for_steps(ranks[0])
        os.kill(ranks[1].pid, signal.SIGSTOP)
        until_quiet(ranks[0])  # rank 0 now waits in the step's all-reduce for rank 1
        ranks[0].send_signal(signal.SIGINT)
        time.sleep(1.5)  # a second Ctrl-C: one within 1 s of the first is that one delivered twice
        ranks[0].send_signal(signal.SIGINT)
        _, stderr = ranks[0].communicate(timeout=60)
        assert ranks[0].returncode == 128 + signal.SIGINT, stderr
        assert stderr.strip().splitlines()[-1] == ("SIGINT: stopped, nothing saved now (checkpoints written before "
                                                   "stay valid)")
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()


def test_a_killed_rank_is_named_and_no_survivor_reports_a_bug(tmp_path):
    out = tmp_path / "run"
    proc = kill_rank_1_mid_epoch(out)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("error: rank 1 was killed by SIGKILL, and the job stopped")
    assert "a bug" not in stderr and not list(out.glob("traceback-*"))
