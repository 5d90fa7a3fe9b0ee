"""What clusters do to a job: a rank killed (torchrun --max-restarts), two nodes meeting through
torchrun's c10d rendezvous as Slurm's launch logic starts them, and, where Slurm is installed
(.ci/run installs it), a real single-node Slurm job cancelled and resubmitted."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY, TWO_RANKS, assert_same_weights, free_port, process_tree, start_two_ranks, train_sh
from mobilenet.checkpoint import load_checkpoint

ONE_RANK_EACH = [a for a in TWO_RANKS if a not in ("--nproc", "2")]
# torchrun sets this for two processes on one node but not for one per node; the same thread count
# gives the same floating-point sums, so two nodes can match one node bit for bit
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def rank_pid(torchrun_pid, rank, local_rank=None):
    """The pid of the worker process of ``rank`` (and ``local_rank``, by default the same) among
    torchrun's children."""
    local_rank = rank if local_rank is None else local_rank
    for pid in process_tree(torchrun_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and f"LOCAL_RANK={local_rank}".encode() in environ:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(torchrun_pid):
                return pid
    raise AssertionError(f"no rank {rank} under {torchrun_pid}")


def kill_rank_1_mid_epoch(out, *extra):
    """start_two_ranks(out, *extra), then kill -9 of rank 1 at step 9; returns the Popen."""
    proc = start_two_ranks(out, *extra)
    for line in proc.stdout:
        if line.startswith("Epoch: [0][9/"):
            os.kill(rank_pid(proc.pid, 1), signal.SIGKILL)
            break
    return proc


def test_killed_rank_restarts_from_the_periodic_checkpoint(tmp_path, straight_two_ranks):
    """kill -9 of one rank mid-epoch: torchrun restarts the job (--max-restarts 1), which resumes
    from the periodic checkpoint and ends with the weights of an uninterrupted run."""
    out = tmp_path / "run"
    proc = kill_rank_1_mid_epoch(out, "--max-restarts", "1", "train.checkpoint_every_minutes=0.0001")
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    assert "torchrun restart 1: every rank resumes from rank 0" in stdout
    resumed = [line for line in stdout.splitlines() if line.startswith("resumed from")]
    assert len(resumed) == 1 and "checkpoints/last.pt (epoch 0, batch " in resumed[0]
    assert int(resumed[0].split("batch ")[1].split(";")[0]) >= 8  # the periodic save, not a restart from 0
    assert_same_weights(straight_two_ranks, out)


def test_two_nodes_through_c10d_rendezvous_as_slurm_launches_them_match_one_node(tmp_path, straight_two_ranks,
                                                                                  request):
    """scripts/slurm/launch.sh as srun runs it on each of two nodes (the environment Slurm sets;
    both 'nodes' on this machine): train.sh's node agents (--nnodes 2, node ranks 0 and 1, torchrun's
    c10d rendezvous), one process each, against one node with two processes."""
    out = tmp_path / "run"
    env = {**ONE_THREAD, "NPROC_PER_NODE": "1", "MASTER_PORT": str(free_port())}
    if shutil.which("slurmctld"):  # scontrol expands SLURM_JOB_NODELIST with the cluster's config
        env.update(SLURM_CONF=request.getfixturevalue("slurm")["SLURM_CONF"])
    else:  # without Slurm, name the first node as srun users may
        env["MASTER_ADDR"] = "127.0.0.1"
    nodes = [subprocess.Popen(["bash", "scripts/slurm/launch.sh", *ONE_RANK_EACH, "--output", str(out)],
                              cwd=ROOT, env={**env, **slurm_environment(node, 2, "4242")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    results = [node.communicate(timeout=240) for node in nodes]
    for node, (stdout, stderr) in zip(nodes, results):
        assert node.returncode == 0, stderr[-3000:]
        # torchrun's store warnings and traceback at an ending the launcher knows (C++ frames) are left out
        assert not re.search(r"frame #|failed to shutdown|Traceback", stderr), stderr[-3000:]
    assert "".join(stdout for stdout, _ in results).count("Prec@1") == 1  # global rank 0 only
    assert "batch 8 per process x 2 = 16 global" in "".join(stdout for stdout, _ in results)
    assert_same_weights(straight_two_ranks, out)


def slurm_environment(node, nodes, job):
    """The variables srun sets that scripts/slurm/launch.sh reads (Slurm 22.05 names)."""
    return {"SLURM_JOB_ID": job, "SLURM_NNODES": str(nodes), "SLURM_NODEID": str(node),
            "SLURM_JOB_NODELIST": "localhost", "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
            "SLURM_NTASKS": str(nodes)}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A single-node Slurm cluster of this machine (munge, slurmctld, slurmd) in a temporary folder;
    yields the environment for sbatch, squeue and scancel."""
    if not all(map(shutil.which, ("slurmctld", "slurmd", "sbatch", "munged"))):
        pytest.skip("Slurm is not installed (.ci/run installs slurmctld slurmd slurm-client munge)")
    root = tmp_path_factory.mktemp("slurm")
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = root / "munge.socket"
    subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={socket_path}",
                    f"--pid-file={root / 'munged.pid'}", f"--log-file={root / 'munged.log'}",
                    f"--seed-file={root / 'munged.seed'}"], check=True)
    host = socket.gethostname()
    conf = root / "slurm.conf"
    conf.write_text(f"""ClusterName=test
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={socket_path}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=30
NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([daemon, "-f", str(conf)], env=env, check=True)
    deadline = time.monotonic() + 60
    while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                       text=True).stdout:
        assert time.monotonic() < deadline, (root / "slurmctld.log").read_text()[-2000:]
        time.sleep(0.5)
    yield env
    subprocess.run(["scontrol", "shutdown"], env=env)
    os.kill(int((root / "munged.pid").read_text()), signal.SIGTERM)


def wait_for_job(job, env, timeout=240):
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} still running"
        time.sleep(0.5)


def test_slurm_job_cancelled_then_resubmitted_ends_as_one_run(tmp_path, slurm, straight_two_ranks):
    """sbatch scripts/slurm/train.sbatch on a real (single-node) Slurm; scancel sends SIGTERM to
    every process of the job, as preemption does; the resubmitted job resumes and ends with the
    weights of an uninterrupted run."""
    out, log = tmp_path / "run", tmp_path / "slurm.out"
    args = [a for a in TWO_RANKS if a not in ("--nproc", "2")] + ["--output", str(out)]
    submit = ["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", f"--cpus-per-task={os.cpu_count()}",
              f"--output={log}", "scripts/slurm/train.sbatch", *args]
    env = {**slurm, "NPROC_PER_NODE": "2"}
    job = subprocess.run(submit, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 120
    while "Epoch: [0][6/" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no output"
        time.sleep(0.2)
    subprocess.run(["scancel", job], env=env, check=True)
    wait_for_job(job, env)
    first = log.read_text()
    assert "SIGTERM: stopped at epoch 0 batch" in first, first[-3000:]
    assert not re.search(r'File ".*(mobilenet/|train\.py)"|killed by signal', first), first[-3000:]
    assert load_checkpoint(out / "checkpoints" / "last.pt")["epoch"] == 0

    job = subprocess.run(submit, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
    wait_for_job(job, env)
    assert "resumed from" in log.read_text()[len(first):], log.read_text()[-3000:]
    assert load_checkpoint(out / "checkpoints" / "last.pt")["epoch"] == 1
    assert_same_weights(straight_two_ranks, out)


def start_node(rank, port, out, *extra, log):
    """One node agent of a two-node job on this machine (train.sh --nnodes 2), output to ``log``."""
    return subprocess.Popen(["bash", "train.sh", *ONE_RANK_EACH, "--nproc", "1", "--nnodes", "2",
                             "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port",
                             str(port), "--output", str(out), *extra],
                            cwd=ROOT, env=ONE_THREAD, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for(log, text, after=0, timeout=120):
    deadline = time.monotonic() + timeout
    while text not in log.read_text()[after:]:
        assert time.monotonic() < deadline, f"no {text!r} in:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def test_elastic_restart_across_two_nodes_resumes_every_rank_from_one_checkpoint(tmp_path, straight_two_ranks):
    """Two node agents, no shared file system (node 1 writes elsewhere, so only rank 0 has the
    checkpoints), --max-restarts 3: kill -9 of node 0's rank mid-epoch, then of node 1's. Each time
    the node whose rank survived restarts it too (torchrun's membership change, its restart count
    not raised); every rank resumes from rank 0's newest checkpoint, and the run ends with the
    weights of an uninterrupted one. Both agents exit."""
    port = free_port()
    outs = [tmp_path / "node0", tmp_path / "node1"]
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    extra = ["--max-restarts", "3", "train.checkpoint_every_minutes=0.0001"]
    nodes = [start_node(rank, port, outs[rank], *extra, log=logs[rank].open("w")) for rank in (0, 1)]
    try:
        wait_for(logs[0], "Epoch: [0][9/")
        os.kill(rank_pid(nodes[0].pid, 0), signal.SIGKILL)
        wait_for(logs[0], "resumed from")
        mark = len(logs[0].read_text())
        wait_for(logs[0], "Epoch: [0][27/", after=mark)
        os.kill(rank_pid(nodes[1].pid, 1, local_rank=0), signal.SIGKILL)
        wait_for(logs[0], "resumed from", after=mark)
        for node in nodes:
            node.wait(timeout=240)
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    text = [log.read_text() for log in logs]
    assert [node.returncode for node in nodes] == [0, 0], text[0][-3000:] + text[1][-3000:]
    resumed = re.findall(r"resumed from \S+ \(epoch 0, batch (\d+); global step \d+\)", text[0])
    assert len(resumed) == 2 and 8 <= int(resumed[0]) < int(resumed[1]), text[0][-3000:]
    assert not (outs[1] / "checkpoints").exists()
    assert [log.strip().splitlines()[-1] for log in text] == [f"node {rank} of 2: the job ended" for rank in (0, 1)]
    assert_same_weights(straight_two_ranks, outs[0])


def test_a_node_whose_partner_never_arrives_exits_with_a_line():
    """--nnodes 2 with one node started: after --join-timeout the agent exits 1 with one line
    that says what to start, instead of waiting on."""
    result = subprocess.run(["bash", "train.sh", *ONE_RANK_EACH, "--nproc", "1", "--nnodes", "2",
                             "--node-rank", "0", "--master-port", str(port := free_port()), "--join-timeout", "2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stdout.strip() == (f"node 0 of 2: meeting the other nodes at 127.0.0.1:{port} (torchrun waits 2 s "
                                     f"for them)")
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: node 0 of 2 at 127.0.0.1:{port}: the other nodes did not all arrive within 2 s; start "
        f"train.sh on every node with the same --nnodes, --master-addr, --master-port and --rdzv-id (and another "
        f"job with other ones)")


def test_a_node_range_says_the_minimum_and_its_wait_and_starts_with_the_nodes_that_came(tmp_path):
    """--nnodes 1:2 on one node: the first line names the minimum and the last call's wait, which
    the job waits (--last-call 3) before it trains on the one node."""
    started = time.monotonic()
    result = subprocess.run(["bash", "train.sh", *TINY, "--data", "synthetic", "data.synthetic_size=64",
                             "--nproc", "1", "--nnodes", "1:2", "--node-rank", "0", "--epochs", "1",
                             "--master-port", str(port := free_port()), "--last-call", "3", "--join-timeout", "60",
                             "--output", str(tmp_path / "run")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == (f"node 0 of 1 to 2: meeting the other nodes at 127.0.0.1:{port} (torchrun waits up to 60 s "
                        f"for 1 node (this one), then 3 s more (--last-call) for up to 2)")
    assert lines[-1] == "node 0 of 1 to 2: the job ended"
    assert time.monotonic() - started >= 3


def test_a_bad_setting_under_nproc_is_one_line_before_torchrun_starts(tmp_path):
    result = train_sh("--nproc", "2", "--data", "synthetic", "optim.lr=-1", "--output", tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr == "error: override 'optim.lr=-1': 'optim.lr' must be positive, got -1.0\n"
    assert result.stdout == "" and not (tmp_path / "run").exists()


def test_a_second_job_on_a_live_output_is_refused_in_the_last_line(tmp_path):
    """A two-process job on the --output of a live run: its refusal is the last line, said once
    (no torchrun failure block around it), exit 2."""
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "train.py", "--data", "synthetic", *TINY, "--epochs", "50",
                              "--output", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        for line in first.stdout:
            if line.startswith("Epoch:"):
                break
        second = train_sh(*TWO_RANKS, "--output", out)
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.communicate(timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    assert re.fullmatch(rf"error: --output {out}: another run is using it \(pid \d+ on .+\); wait for it to end or "
                        rf"stop it, or pass another --output", second.stderr.strip().splitlines()[-1])
    assert second.stderr.count("another run is using it") == 1 and "ChildFailedError" not in second.stderr

