import contextlib
import json

import pytest
import torch

import train
from conftest import TINY
from mobilenet.amp import NativePrecision, build_precision, choose_backend
from mobilenet.checkpoint import load_checkpoint
from mobilenet.model import MobileNetV1
from mobilenet.optim import build_optimizer
from mobilenet.training import TrainStep

CPU = torch.device("cpu")


def amp_cfg(level, dtype="float16", loss_scale="dynamic"):
    return {"level": level, "dtype": dtype, "loss_scale": loss_scale, "backend": "auto"}


def o2_setup(impl, dtype="float16", loss_scale="dynamic"):
    """(model, precision, optimizer) of a TrainStep at O2; impl standard runs the loop. With
    momentum: its buffers exist from the first step on, and torch_fused then skips on the device."""
    torch.manual_seed(0)
    model = MobileNetV1(0.25, 10)
    implementation = "torch_fused" if impl == "fused" else "loop"
    precision = build_precision(amp_cfg("O2", dtype, loss_scale), backend="native", device=CPU,
                                net=model, skip_on_device=implementation == "torch_fused")
    optimizer = build_optimizer(precision.params(model), implementation=implementation, lr=0.1, momentum=0.9)
    return model, precision, optimizer


def test_native_selected_without_apex():
    assert choose_backend("O1", "auto", "cpu") == choose_backend("O2", "auto", "npu") == "native"
    assert choose_backend("O0", "auto", "cpu") == "none"
    for level in ("O1", "O2"):
        precision = build_precision(amp_cfg(level), backend="native", device=CPU, net=MobileNetV1(0.25, 10))
        assert type(precision) is NativePrecision and (precision.masters is not None) == (level == "O2")


def test_o2_half_model_fp32_batchnorm_and_masters():
    model, precision, optimizer = o2_setup("fused")
    for module in model.modules():
        for p in module.parameters(recurse=False):
            bn = isinstance(module, torch.nn.BatchNorm2d)
            assert p.dtype == (torch.float32 if bn else torch.float16)
    owned = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(owned) == 83 and all(p.dtype == torch.float32 for p in owned)
    assert precision.input_dtype == torch.float16
    # one buffer per dtype for the model's weights, its grads, the masters and their grads: each
    # copy or cast between them is one launch per dtype (a multi-tensor copy makes one per tensor)
    def storages(tensors):
        return len({t.untyped_storage().data_ptr() for t in tensors})
    params = list(model.parameters())
    assert storages(params) == storages(p.grad for p in params) == 2
    assert storages(owned) == storages(p.grad for p in owned) == 2


def test_o2_buffers_keep_each_tensors_layout_and_values():
    from mobilenet.amp import MasterWeights
    torch.manual_seed(0)
    model = MobileNetV1(0.25, 10).to(memory_format=torch.channels_last)
    weights = [p.detach().clone() for p in model.parameters()]
    masters = MasterWeights(model, torch.float16)
    for weight, param, master in zip(weights, model.parameters(), masters.params):
        assert param.stride() == master.stride() == weight.stride() == param.grad.stride()
        assert torch.equal(master, weight) and torch.equal(param, weight.to(param.dtype))


def step(model, precision, optimizer, inject_inf=False, phase=None):
    """One TrainStep call on the model's device; ``inject_inf`` puts an inf into a grad between
    backward and unscale; ``phase``: a phase hook of the test's own."""
    train_step = TrainStep(net=model, wrapped=model, optimizer=optimizer, precision=precision,
                           criterion=torch.nn.CrossEntropyLoss(), implementation="loop")

    def inject(name):
        if inject_inf and name == "unscale":
            model.fc.weight.grad[0, 0] = float("inf")
        return contextlib.nullcontext()
    train_step.phase = phase or inject
    data, device = torch.Generator().manual_seed(2), model.fc.weight.device
    images = torch.randn(8, 3, 32, 32, generator=data).to(device, precision.input_dtype)
    labels = torch.randint(0, 10, (8,), generator=data).to(device)
    train_step(images, labels)


@pytest.mark.parametrize("impl", ["standard", "fused"])
def test_injected_inf_skips_exactly_one_step_and_halves_the_scale(impl):
    model, precision, optimizer = o2_setup(impl)
    while not optimizer.state:  # the first steps may overflow at the initial scale 2**16
        step(model, precision, optimizer)
    scale, skipped = precision.scaler.scale.item(), precision.scaler.skipped.item()
    masters = [m.detach().clone() for m in precision.masters.params]
    weights = {k: v.detach().clone() for k, v in model.named_parameters()}
    momentum = [optimizer.state[m]["momentum_buffer"].clone() for m in precision.masters.params]
    step(model, precision, optimizer, inject_inf=True)  # fused: skipped inside the kernel (found_inf)
    assert all(torch.equal(a, b) for a, b in zip(masters, precision.masters.params))
    assert all(torch.equal(v, p) for v, p in zip(weights.values(), model.parameters()))
    assert all(torch.equal(a, optimizer.state[m]["momentum_buffer"])
               for a, m in zip(momentum, precision.masters.params))
    assert precision.scaler.scale.item() == scale / 2
    assert precision.scaler.skipped.item() == skipped + 1
    for _ in range(3):  # 2**13 at most: clean steps update the masters again
        step(model, precision, optimizer)
    assert not torch.equal(masters[0], precision.masters.params[0])
    # the model holds the half-precision copy of the updated masters
    torch.testing.assert_close(model.fc.weight, precision.masters.params[-2].half())


def test_overflow_at_the_first_step_leaves_fused_momentum_clean():
    """torch's fused SGD creates momentum buffers with empty_like: skipping its very first step on
    the device would leave them uninitialised. Standard and fused must agree after it."""
    runs = []
    for impl in ("standard", "fused"):
        model, precision, optimizer = o2_setup(impl, loss_scale=128)
        step(model, precision, optimizer, inject_inf=True)
        for _ in range(3):
            step(model, precision, optimizer)
        runs.append([m.detach().clone() for m in precision.masters.params])
    for a, b in zip(*runs):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_o2_masters_take_every_grad_group_and_all_move():
    """What the optimizer reads at O2 is every model grad, unscaled: the half group and BatchNorm's
    fp32 group alike (a copy of one group only would leave the other's masters still)."""
    model, precision, optimizer = o2_setup("standard", loss_scale=128)
    seen = {}

    def phase(name):
        if name == "optimizer":  # after unscale, before the step: what the step will read
            seen["model"] = [p.grad.float() / 128 for p in model.parameters()]
            seen["masters"] = [m.grad.clone() for m in precision.masters.params]
        return contextlib.nullcontext()
    before = [m.detach().clone() for m in precision.masters.params]
    step(model, precision, optimizer, phase=phase)
    names = [name for name, _ in model.named_parameters()]
    assert {p.dtype for p in model.parameters()} == {torch.float16, torch.float32}  # two groups
    for name, master_grad, model_grad in zip(names, seen["masters"], seen["model"]):
        assert torch.equal(master_grad, model_grad), name
    for name, was, master in zip(names, before, precision.masters.params):
        assert not torch.equal(was, master), f"{name} did not move"


def test_static_scale_stays_after_an_overflow():
    model, precision, optimizer = o2_setup("fused", loss_scale=1024)
    step(model, precision, optimizer, inject_inf=True)
    assert precision.scaler.scale.item() == 1024 and precision.scaler.skipped.item() == 1


@pytest.mark.parametrize("level,impl", [("O1", "standard"), ("O1", "fused"), ("O2", "fused")])
def test_one_optimizer_step_per_iteration_and_checkpointed_state(tmp_path, digits, level, impl):
    """Adam counts its steps: with 2 epochs of 6 iterations, steps + skipped must be 12."""
    out = tmp_path / "run"
    args = ["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out), *TINY,
            "--amp", level, "--optimizer", impl, "optim.name=adam", "optim.lr=0.001",
            "amp.dtype=bfloat16", "train.max_steps_per_epoch=6", "--epochs", "2"]
    assert train.main(args) == 0
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    adam_steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    skipped = state["amp"]["scaler"]["skipped"]
    assert len(adam_steps) == 1 and adam_steps.pop() + skipped == 12
    assert all(v.dtype == torch.float32 for v in state["state_dict"].values()
               if v.dtype.is_floating_point)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("loss_scale" in r and "skipped_steps" in r for r in records if r["kind"] == "train")

    resumed = train.main(args[:-1] + ["3", "--resume", "auto"])
    assert resumed == 0
    state3 = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state3["epoch"] == 3
    assert state3["amp"]["scaler"]["scale"] >= state["amp"]["scaler"]["scale"] / 2 ** 6


def test_gradscaler_cannot_keep_these_guarantees():
    """Why amp.LossScaler is ours: the limits of torch.amp.GradScaler it works around. When this
    test fails, torch lifted one, and LossScaler may give way to GradScaler."""
    with pytest.raises((AssertionError, ValueError), match="growth factor must be > 1"):
        torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=1.0)  # no static scale
    assert not any("skip" in key for key in torch.amp.GradScaler("cpu").state_dict())
    param = torch.nn.Parameter(torch.ones(64))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale((param * float("inf")).sum()).backward()
    scaler.step(optimizer)  # the first step overflows and is skipped, yet a momentum buffer now
    assert param.data.eq(1).all() and "momentum_buffer" in optimizer.state[param]  # exists: made by
    # empty_like and never written, so the next step would add whatever that memory held
