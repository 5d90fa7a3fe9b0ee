"""ModelZoo's path, apex amp with apex's NpuFusedSGD, run on cpu under tests/standin_apex.py (a
stand-in written from Ascend apex's source; it tests our wiring, not apex's kernels)."""
import json
import os
import re
import sys
import types

import pytest
import torch

import standin_apex
import train
from conftest import ROOT, TINY
from mobilenet.amp import ApexPrecision, choose_backend
from mobilenet.checkpoint import load_checkpoint
from mobilenet.config import build_config, resolve
from mobilenet.errors import UsageError
from mobilenet.model import MobileNetV1
from mobilenet.optim import build_optimizer
from mobilenet.training import TrainStep
from mobilenet.state import TrainingState

APEX = ["amp.backend=apex", "--optimizer", "fused", "optim.momentum=0.9", "train.max_steps_per_epoch=6"]


@pytest.fixture
def apex(monkeypatch):
    return standin_apex.install(monkeypatch)


def run(digits, out, *extra):
    return train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out), *TINY,
                       "train.log_every=2", *APEX, *extra])


def test_auto_takes_ascend_apex_on_npu_only(apex, monkeypatch):
    assert choose_backend("O2", "auto", "npu") == "apex"
    assert choose_backend("O2", "auto", "cpu") == choose_backend("O2", "auto", "cuda") == "native"
    assert choose_backend("O1", "apex", "cpu") == "apex"
    with pytest.raises(UsageError, match="amp.backend=apex at amp.level O0"):
        choose_backend("O0", "apex", "npu")
    nvidia = types.ModuleType("apex.optimizers")  # NVIDIA apex: FusedSGD, no NpuFusedSGD
    nvidia.FusedSGD = torch.optim.SGD
    monkeypatch.setitem(sys.modules, "apex.optimizers", nvidia)
    assert choose_backend("O2", "auto", "npu") == "native"
    with pytest.raises(UsageError, match="not Ascend's fork"):
        choose_backend("O2", "apex", "npu")


@pytest.mark.parametrize("extra,message", [
    (["--amp", "O0"], "amp.backend=apex at amp.level O0"),
    (["--amp", "O2"], None)])
def test_refusals_are_one_line(apex, tmp_path, digits, capsys, extra, message, monkeypatch):
    if message is None:  # NVIDIA apex with its old amp: refused where apex is asked for
        monkeypatch.setitem(sys.modules, "apex.optimizers", types.ModuleType("apex.optimizers"))
        message = "not Ascend's fork"
    assert run(digits, tmp_path / "run", *extra) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and not (tmp_path / "run").exists()


def test_what_apex_cannot_do_is_refused_and_implied_nowhere(apex, tmp_path, digits, capsys):
    """apex casts to float16 only: bfloat16 is refused, not trained in float16 while config.yaml
    says bfloat16; compile is refused under apex, and the implementation's table says so too."""
    from mobilenet.optim import IMPLEMENTATIONS
    assert run(digits, tmp_path / "bf16", "--amp", "O2", "amp.dtype=bfloat16") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: amp.dtype=bfloat16 under apex: Ascend's apex casts to float16 only; use "
                     "amp.dtype=float16, or amp.backend=native for bfloat16"]
    with pytest.raises(UsageError, match="apex amp patches the model"):
        resolve(build_config(ROOT / "configs" / "demo.yaml", [*TINY, "amp.level=O2", "amp.backend=apex",
                                                               "optim.impl=fused", "train.compile=true"]))
    assert not IMPLEMENTATIONS["apex_npu_fused"].compile_step


def test_modelzoo_static_scale_trains_and_an_overflow_stops_the_run(apex, tmp_path, digits, capsys):
    """ModelZoo's recipe: O2 at a static scale of 1024. apex checks nothing at a static scale (an
    overflowing step is applied), so an overflow makes the weights and the loss non-finite and the
    run stops at the next loss check in one line, the last checkpoint kept."""
    assert run(digits, tmp_path / "run", "--amp", "O2", "amp.loss_scale=1024", "--epochs", "1") == 0
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert saved["amp"]["apex"]["loss_scaler0"]["loss_scale"] == 1024 and saved["amp"]["skipped"] == 0
    capsys.readouterr()
    assert run(digits, tmp_path / "overflow", "--amp", "O2", "amp.loss_scale=1024", "--epochs", "1",
               "optim.lr=1e30") == 1  # the first step's update overflows float16
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"error: the loss became (nan|inf) in epoch 0 before batch 2: stopped; nothing saved after "
                        r".*/checkpoints/last.pt", error), error


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_apex_path_trains_saves_fp32_and_resumes_bit_identical(apex, tmp_path, digits, level):
    assert run(digits, tmp_path / "straight", "--amp", level, "--epochs", "2") == 0
    assert run(digits, tmp_path / "resumed", "--amp", level, "--epochs", "2", "train.max_steps=8") == 0
    assert run(digits, tmp_path / "resumed", "--amp", level, "--epochs", "2", "--resume", "auto") == 0
    a, b = (load_checkpoint(tmp_path / r / "checkpoints" / "last.pt") for r in ("straight", "resumed"))
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["optimizer_class"].startswith("apex NpuFusedSGD") and summary["amp_backend"] == "apex"
    assert (a["epoch"], a["epoch_step"]) == (b["epoch"], b["epoch_step"]) == (2, 0)
    assert a["amp"] == b["amp"] and a["amp"]["skipped"] > 0  # the dynamic scale starts at 2**16
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
        assert not value.is_floating_point() or value.dtype == torch.float32, key
    for index, state in a["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"], b["optimizer"]["state"][index]["momentum_buffer"])
    if level == "O2":  # the masters, not the half weights cast back: apex's fp32 updates are kept
        weight = a["state_dict"]["model.1.0.weight"]
        assert not torch.equal(weight, weight.half().float())
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert train_records and all("loss_scale" in r and "skipped_steps" in r for r in train_records)
    assert train_records[-1]["skipped_steps"] == a["amp"]["skipped"]
    assert train_records[-1]["loss_scale"] == a["amp"]["apex"]["loss_scaler0"]["loss_scale"]


def test_a_skipped_overflow_leaves_weights_and_momentum(apex):
    torch.manual_seed(0)
    net = MobileNetV1(0.25, 10)
    optimizer = build_optimizer(net, implementation="apex_npu_fused", lr=0.1, momentum=0.9)
    precision = ApexPrecision(apex.amp, "O2", "dynamic")
    net, optimizer = precision.initialize(net, optimizer)
    step = TrainStep(net=net, wrapped=net, optimizer=optimizer, precision=precision,
                     criterion=torch.nn.CrossEntropyLoss(), implementation="apex_npu_fused")
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    while not optimizer.state:  # the first steps overflow at 2**16 and are skipped
        step(images, labels)
    masters = [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]
    weights = [p.detach().clone() for p in net.parameters()]
    momentum = [s["momentum_buffer"].clone() for s in optimizer.state.values()]
    scale, skipped = precision.current_scale(), precision.skipped
    hook = net.fc.weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    step(images, labels)
    hook.remove()
    assert precision.skipped == skipped + 1 and precision.current_scale() == scale / 2
    owned = [p for group in optimizer.param_groups for p in group["params"]]
    assert all(torch.equal(a, b) for a, b in zip(masters, owned))
    assert all(torch.equal(a, b) for a, b in zip(weights, net.parameters()))
    assert all(torch.equal(a, s["momentum_buffer"]) for a, s in zip(momentum, optimizer.state.values()))
    step(images, labels)  # a clean step updates again
    assert not torch.equal(masters[0], owned[0])


def test_a_modelzoo_checkpoint_loads_into_the_masters(apex, tmp_path):
    torch.manual_seed(1)
    trained = MobileNetV1(0.25, 10)
    modelzoo = {"epoch": 90, "arch": "mobilenet", "best_prec1": 70.0, "optimizer": {},
                "state_dict": {f"module.{k}": v for k, v in trained.state_dict().items()}}
    cfg = resolve(build_config(ROOT / "configs" / "demo.yaml", [*TINY, "amp.level=O2", "amp.backend=apex",
                                                                "optim.impl=fused", "data.path=synthetic"]))
    state = TrainingState(cfg, torch.device("cpu"), steps_per_epoch=6)
    state.load_weights(modelzoo, "modelzoo.pth")
    masters = state.step.precision.masters()
    for name, weight in trained.named_parameters():
        assert torch.equal(masters[name], weight.detach()), name
        assert torch.equal(state.step.net.get_parameter(name), weight.detach().to(
            state.step.net.get_parameter(name).dtype)), name


def test_the_standin_keeps_apexs_rules(apex):
    """What the stand-in must refuse as apex does, or the tests above could pass on wiring that the
    real apex stops (Ascend/apex 5.0.0: npu_fused_sgd.py, _process_optimizer.py, _initialize.py)."""
    net = MobileNetV1(0.25, 10)
    sgd = apex.optimizers.NpuFusedSGD(net.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="should be used with AMP"):
        sgd.step()
    with pytest.raises(RuntimeError, match="npu fused optimizer can only be used when opt_level='O1'"):
        apex.amp.initialize(net, sgd, opt_level="O0")
    net = MobileNetV1(0.25, 10)
    net, sgd = apex.amp.initialize(net, apex.optimizers.NpuFusedSGD(net.parameters(), lr=0.1),
                                   opt_level="O2", combine_grad=True)
    with pytest.raises(TypeError):
        sgd.zero_grad(set_to_none=False)  # apex's zero_grad takes only self
    with pytest.raises(AssertionError, match="set_to_none"):
        net.zero_grad(set_to_none=True)  # torch.nn.Module.zero_grad, replaced for the process (apex 5.0)
    with pytest.raises(RuntimeError, match="only be passed through amp.initialize once"):
        apex.amp.initialize(MobileNetV1(0.25, 10), sgd, opt_level="O2")
    net = torch.nn.DataParallel(MobileNetV1(0.25, 10))  # DDP alike (tests/test_ranks.py: the app's order)
    with pytest.raises(RuntimeError, match="Parallel wrappers should only be applied"):
        apex.amp.initialize(net, apex.optimizers.NpuFusedSGD(net.parameters(), lr=0.1), opt_level="O2")


def apex_step(apex, loss_scale=128.0, wrap=lambda net: net):
    """A TrainStep of MobileNetV1 0.25 at apex O2 with NpuFusedSGD; BatchNorm frozen, so that a batch's
    grads are the sum of its parts' (up to float16's rounding)."""
    torch.manual_seed(0)
    net = MobileNetV1(0.25, 10)
    optimizer = build_optimizer(net, implementation="apex_npu_fused", lr=0.1, momentum=0.9)
    precision = ApexPrecision(apex.amp, "O2", loss_scale)
    net, optimizer = precision.initialize(net, optimizer)
    step = TrainStep(net=net, wrapped=wrap(net), optimizer=optimizer, precision=precision,
                     criterion=torch.nn.CrossEntropyLoss(), implementation="apex_npu_fused")
    step.train(freeze_bn=True)
    return step


def parts(count, size=8):
    data = torch.Generator().manual_seed(5)
    return [(torch.randn(size, 3, 32, 32, generator=data), torch.randint(0, 10, (size,), generator=data))
            for _ in range(count)]


def masters(step):
    return [p.detach().clone() for group in step.optimizer.param_groups for p in group["params"]]


def test_apex_accumulates_what_one_batch_trains(apex):
    """Two forwards of 8 under apex (its stash: each backward's unscaled grads added to the ones so far)
    make the update one forward of the 16 makes, within float16's rounding."""
    halves = parts(2)
    whole = [(torch.cat([halves[0][0], halves[1][0]]), torch.cat([halves[0][1], halves[1][1]]))]
    updates = []
    for batches in (halves, whole):
        step = apex_step(apex)
        before = masters(step)
        step.accumulated(batches)
        updates.append([after - was for after, was in zip(masters(step), before)])
    for accumulated, one in zip(*updates):
        torch.testing.assert_close(accumulated, one, rtol=2e-2, atol=2e-5)


@pytest.mark.parametrize("overflowing, scale", [({0}, 2.0**15), ({1}, 2.0**15), ({0, 1}, 2.0**14)])
def test_apex_counts_a_step_skipped_once_however_many_forwards_overflow(apex, overflowing, scale):
    """The forwards whose grads are not finite (a hook on the classifier's weight): apex halves the
    scale at each, skips the step once (weights and momentum stay)."""
    step = apex_step(apex, loss_scale="dynamic")
    before = masters(step)
    backwards = []

    def not_finite_in_some(grad):
        backwards.append(grad)
        return grad * float("inf") if len(backwards) - 1 in overflowing else grad
    classifier = next(m for m in step.net.modules() if isinstance(m, torch.nn.Linear))
    classifier.weight.register_hook(not_finite_in_some)
    step.accumulated(parts(2))
    assert step.precision.metrics() == {"loss_scale": scale, "skipped_steps": 1}
    assert all(torch.equal(a, b) for a, b in zip(before, masters(step))) and not step.optimizer.state


def accumulate_on_a_rank(rank, init, out):
    """One of two DDP processes (gloo) under the stand-in: two forwards, its share of parts(4)."""
    sys.modules.update(standin_apex.modules())
    torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    step = apex_step(standin_apex, wrap=torch.nn.parallel.DistributedDataParallel)
    step.accumulated(parts(4)[2 * rank:2 * rank + 2])
    torch.save(masters(step), out / f"{rank}.pt")
    torch.distributed.destroy_process_group()
    os._exit(0)  # as train.py ends (mobilenet.distributed.exit_process): torch's teardown may abort it


def test_apex_on_two_processes_accumulates_what_one_process_does(apex, tmp_path):
    """Two processes x two forwards under apex train one process's four forwards: each forward
    all-reduces (DDP's no_sync would reduce the last forward's grads alone, as apex's stash holds the
    others), and the ranks end equal."""
    torch.multiprocessing.spawn(accumulate_on_a_rank, args=(tmp_path / "init", tmp_path), nprocs=2)
    ranks = [torch.load(tmp_path / f"{rank}.pt") for rank in range(2)]
    step = apex_step(apex)
    before = masters(step)
    step.accumulated(parts(4))
    for zero, one, alone, was in zip(*ranks, masters(step), before):
        assert torch.equal(zero, one)
        torch.testing.assert_close(zero - was, alone - was, rtol=2e-2, atol=2e-5)
