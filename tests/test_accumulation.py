"""Gradient accumulation and another number of processes (train.grad_accum_steps, data.global_batch):
one process accumulating A forwards trains what A processes train, forward by forward; a run
stopped mid-epoch goes on with another number of processes at the same global batch. Every run is
at one thread (torchrun's processes with OMP_NUM_THREADS=1, the one-process side in this process
through train_here's one_thread), so their float sums are the same."""
import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, TINY, train_sh
from mobilenet.checkpoint import load_checkpoint
from mobilenet.data.datasets import ResumableSampler

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
RUN = ["--config", "configs/demo.yaml", *TINY, "data.batch_size=16", "data.cache_mb=0", "train.log_every=2",
       "train.max_steps_per_epoch=8", "--epochs", "1"]


def forwards(length, processes, accumulation, batch, start=0):
    """[[sample ids of each forward of each process] for each global step] from ``start``."""
    samplers = [ResumableSampler(length, rank, processes, seed=3, batch=batch, accumulation=accumulation)
                for rank in range(processes)]
    for sampler in samplers:
        sampler.set_epoch(2, start)
    streams = [[index for index, _ in sampler] for sampler in samplers]
    steps = samplers[0].steps - start
    return [[stream[(step * accumulation + m) * batch:(step * accumulation + m + 1) * batch]
             for stream in streams for m in range(accumulation)] for step in range(steps)]


@pytest.mark.parametrize("world", [(2, 1, 1, 2), (4, 1, 1, 4), (4, 1, 2, 2)])
def test_each_forward_holds_what_its_virtual_rank_would(world):
    """processes x accumulation fixed: every global step's forwards hold the same ids, in the same
    order, from any global step on (a resume's start)."""
    processes_a, accumulation_a, processes_b, accumulation_b = world
    for start in (0, 5):
        a = forwards(1437, processes_a, accumulation_a, 16, start)
        b = forwards(1437, processes_b, accumulation_b, 16, start)
        assert a == b and len(a) == 1437 // (processes_a * accumulation_a * 16) - start


def weights(out):
    """The checkpoint's weights, less BatchNorm's running statistics (they follow the forwards)."""
    state = load_checkpoint(out / "checkpoints" / "last.pt")["state_dict"]
    return {k: v for k, v in state.items() if "running_" not in k and "num_batches" not in k}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, digits):
    out = tmp_path_factory.mktemp("two") / "run"
    result = train_sh("--nproc", "2", *RUN, "--data", digits, "--output", out, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_one_process_accumulating_two_forwards_trains_what_two_processes_train(two_processes, digits, tmp_path,
                                                                                train_here):
    one = train_here(*RUN, "--data", digits, "--grad-accum-steps", "2", "--output", tmp_path / "one", one_thread=True)
    assert one.returncode == 0, one.stderr[-2000:]
    assert "batch 16 per process x 1 x 2 forwards accumulated = 32 global" in one.stdout
    ours, theirs = weights(tmp_path / "one"), weights(two_processes)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_two_processes_stopped_mid_epoch_go_on_as_one(two_processes, digits, tmp_path, train_here):
    """SIGTERM to a 2-process run mid-epoch; the resume on one process keeps the global batch (it
    accumulates 2 forwards, said in one note) and ends with the straight 2-process run's weights."""
    out = tmp_path / "run"
    proc = subprocess.Popen(["bash", "train.sh", "--nproc", "2", *RUN, "--data", str(digits), "--output", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ONE_THREAD,
                            start_new_session=True)
    for line in proc.stdout:
        if line.startswith("Epoch: [0][4/8]"):
            os.killpg(proc.pid, signal.SIGTERM)
            break
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    stopped = load_checkpoint(out / "checkpoints" / "last.pt")
    assert 4 <= stopped["epoch_step"] < 8 and len(stopped["rng"]) == 2
    # another global batch on 2 processes: refused mid-epoch in one line, once, naming the way on
    other = train_sh("--nproc", "2", *RUN, "--data", digits, "--output", out, "--resume", "auto",
                     "--grad-accum-steps", "2", env=ONE_THREAD)
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1, other.stderr[-3000:]
    assert "at global batch 32; this run's is 64" in other.stderr and "train.resume_next_epoch=true" in other.stderr
    resumed = train_here(*RUN, "--data", digits, "--output", out, "--resume", "auto", one_thread=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert ("note: the checkpoint trained with 2 process(es) x data.batch_size 16 x 1 forward(s) = global batch 32, "
            "lr 0.1; this run has 1 x 16 x 2 = 32, lr 0.1, the same global batches") in resumed.stdout
    ours, theirs = weights(out), weights(two_processes)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # the position counts global batches (optimizer steps), not forwards: as the straight run's
    went_on, straight = (load_checkpoint(run / "checkpoints" / "last.pt") for run in (out, two_processes))
    assert went_on["global_step"] == straight["global_step"] == 8
    assert went_on["scheduler"]["last_epoch"] == straight["scheduler"]["last_epoch"]


def test_each_rank_draws_from_a_generator_seeded_for_its_rank(two_processes):
    """Every rank's random generators are seeded from (seed, rank, step): the ranks' states differ,
    and each is what its own seed gives (MobileNetV1 draws nothing in its forward)."""
    from mobilenet.state import training_seed
    saved = load_checkpoint(two_processes / "checkpoints" / "last.pt")
    seed = saved["config"]["seed"]
    for rank, states in enumerate(saved["rng"]):
        torch.manual_seed(training_seed(seed, rank, 0))
        assert torch.equal(states["torch"], torch.get_rng_state()), rank
    assert not torch.equal(saved["rng"][0]["torch"], saved["rng"][1]["torch"])


def test_four_forwards_on_one_process_against_four_processes(digits, tmp_path, train_here):
    """The same ids per forward (above); the first optimizer step's weights within 1e-6 relative (gloo
    adds four ranks' grads in another order than one process adds four forwards')."""
    first = [*RUN, "--data", digits, "train.max_steps=1"]
    four = train_sh("--nproc", "4", *first, "--output", tmp_path / "four", env=ONE_THREAD)
    one = train_here(*first, "data.global_batch=64", "--output", tmp_path / "one", one_thread=True)
    assert four.returncode == 0 and one.returncode == 0, (four.stderr[-1000:], one.stderr[-1000:])
    ours, theirs = weights(tmp_path / "one"), weights(tmp_path / "four")
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-6, atol=1e-7, msg=key)


def test_an_inf_in_one_forward_skips_the_whole_step_once():
    """Native O2 over two forwards: an inf in the first forward's grads skips the optimizer step
    (masters, half weights and momentum stay), counted once, and the scale halves once."""
    from test_amp import o2_setup

    from mobilenet.training import TrainStep
    model, precision, optimizer = o2_setup("fused", loss_scale="dynamic")
    step = TrainStep(net=model, wrapped=model, optimizer=optimizer, precision=precision,
                     criterion=torch.nn.CrossEntropyLoss(), implementation="torch_fused")
    data = torch.Generator().manual_seed(2)
    batches = [(torch.randn(8, 3, 32, 32, generator=data).to(precision.input_dtype),
                torch.randint(0, 10, (8,), generator=data)) for _ in range(2)]
    while not optimizer.state:  # the first steps may overflow at the initial scale 2**16
        step.accumulated(batches)
    masters = [m.detach().clone() for m in precision.masters.params]
    scale, skipped = precision.scaler.scale.item(), precision.scaler.skipped.item()
    forwards = []

    def inf_in_the_first(name):
        if name == "backward":
            forwards.append(name)
            if len(forwards) == 2:  # the second forward's backward: the first forward's grads are in
                model.fc.weight.grad[0, 0] = float("inf")
        return contextlib.nullcontext()
    step.phase = inf_in_the_first
    step.accumulated(batches)
    assert all(torch.equal(a, b) for a, b in zip(masters, precision.masters.params))
    assert precision.scaler.scale.item() == scale / 2 and precision.scaler.skipped.item() == skipped + 1


@pytest.mark.parametrize("implementation", ["loop", "foreach", "torch_fused", "plain", "npu_fused"])
def test_every_implementation_accumulates_what_one_batch_trains(implementation, monkeypatch):
    """Two optimizer steps of two forwards of 8 against steps of one forward of their 16 (BatchNorm
    frozen, so the grads are the sum of the parts'), in fp32: torch_npu's NpuFused* (its stand-in)
    keeps the grads in its combined buffer from the first step on, and the second step adds into it."""
    import standin_torch_npu
    from test_amp import CPU, amp_cfg

    from mobilenet.amp import build_precision
    from mobilenet.model import MobileNetV1
    from mobilenet.optim import build_optimizer
    from mobilenet.training import TrainStep
    monkeypatch.setitem(sys.modules, "torch_npu", standin_torch_npu)
    data = torch.Generator().manual_seed(4)
    halves = [[(torch.randn(8, 3, 32, 32, generator=data), torch.randint(0, 10, (8,), generator=data))
               for _ in range(2)] for _ in range(2)]
    weights = []
    for accumulate in (True, False):
        torch.manual_seed(0)
        net = MobileNetV1(0.25, 10)
        precision = build_precision(amp_cfg("O0"), backend="none", device=CPU, net=net)
        optimizer = build_optimizer(net, implementation=implementation, lr=0.1, momentum=0.9)
        step = TrainStep(net=net, wrapped=net, optimizer=optimizer, precision=precision,
                         criterion=torch.nn.CrossEntropyLoss(), implementation=implementation)
        step.train(freeze_bn=True)
        for parts in halves:
            whole = [(torch.cat([parts[0][0], parts[1][0]]), torch.cat([parts[0][1], parts[1][1]]))]
            step.accumulated(parts if accumulate else whole)
        weights.append([p.detach().clone() for p in net.parameters()])
    for accumulated, whole in zip(*weights):
        torch.testing.assert_close(accumulated, whole, rtol=1e-5, atol=1e-6)


def test_the_breakdown_counts_an_optimizer_steps_ops_under_accumulation(tmp_path):
    """train.measure_breakdown counts the ops of the third optimizer step, whatever forwards fill
    it: the optimizer's ops are the same with two forwards a step as with one, the step's more."""
    import train
    counted = {}
    for forwards in (1, 2):
        out = tmp_path / str(forwards)
        assert train.main([*RUN, "--data", "synthetic", "train.measure_breakdown=true", "train.max_steps=4",
                           "--grad-accum-steps", str(forwards), "--output", str(out)]) == 0
        counted[forwards] = json.loads((out / "summary.json").read_text())
    assert counted[1]["optimizer_ops_per_step"] > 100  # the loop's ops for MobileNetV1's tensors
    assert counted[2]["optimizer_ops_per_step"] == counted[1]["optimizer_ops_per_step"]
    assert counted[2]["step_ops_per_step"] > counted[1]["step_ops_per_step"]


def test_a_step_of_two_forwards_all_reduces_the_grads_once(tmp_path):
    """DDP's no_sync around every forward but the last: a step of two forwards makes as many
    gradient all-reduces as a step of one (the results would be equal either way; the traffic not)."""
    out = tmp_path / "counts.json"
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(ROOT / "tests" / "count_allreduces.py"), str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**ONE_THREAD, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(out.read_text())
    assert counts["one forward"] > 0 and counts["two forwards"] == counts["one forward"], counts
