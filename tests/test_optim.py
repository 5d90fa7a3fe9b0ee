import json
import sys

import pytest
import torch

import standin_torch_npu
import train
from conftest import ROOT, TINY
from mobilenet.config import DEFAULTS, build_config, resolve
from mobilenet.model import MobileNetV1
from mobilenet.optim import (ALGORITHMS, parameter_decays, IMPLEMENTATIONS, SCHEDULES, build_optimizer,
                             choose_implementation, describe_optimizer)
from mobilenet.state import build_scheduler, lr_factor_fn, schedule_at

FAMILIES = ["sgd", "adam", "adamw", "rmsprop"]
HYPER = {"momentum": 0.9, "nesterov": False, "betas": (0.9, 0.999), "eps": 1e-8, "alpha": 0.99}


def make(model, name, impl, device="cpu", **kwargs):
    """build_optimizer as the app calls it: the implementation optim.impl resolves to."""
    implementation = choose_implementation(name=name, impl=impl, device=device)
    hyper = {key: HYPER[key] for key in ALGORITHMS[name].hyperparameters}
    return build_optimizer(model, implementation=implementation, name=name, **hyper, **kwargs), implementation


def train_steps(impl, name, steps=4, decays=None):
    torch.manual_seed(0)
    model = MobileNetV1(width_mult=0.25, num_classes=10)
    optimizer, implementation = make(model, name, impl, lr=0.01, weight_decay=1e-4,
                                     decays=decays(model) if decays else None)
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        images = torch.randn(8, 3, 32, 32, generator=data)
        labels = torch.randint(0, 10, (8,), generator=data)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=IMPLEMENTATIONS[implementation].grads_to_none)
    return model, optimizer


def assert_same_weights(a, b, initial):
    """Equal tensors (fp32 tolerance) in dicts a and b, most of them changed from initial."""
    moved = 0
    for (key, x), y, x0 in zip(a.items(), b.values(), initial.values()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=key)
        moved += x.dtype.is_floating_point and not torch.equal(x, x0)
    assert moved > 50  # the steps really changed the weights


def test_fused_sgd_trains_like_standard():
    """Forward, backward and step through the network: the recipe's optimizer, 4 steps."""
    torch.manual_seed(0)
    initial = MobileNetV1(width_mult=0.25, num_classes=10)
    standard, _ = train_steps("standard", "sgd")
    fused, _ = train_steps("fused", "sgd")
    assert_same_weights(standard.state_dict(), fused.state_dict(), initial.state_dict())


@pytest.mark.parametrize("name", FAMILIES)
def test_fused_update_rule_matches_standard(name):
    """Both implementations fed the same gradients for 8 steps. (Trained through the network,
    Adam's normalised steps amplify last-bit differences chaotically, so the update rule is what
    is compared for every family.)"""
    torch.manual_seed(0)
    initial = MobileNetV1(width_mult=0.25, num_classes=10)
    models = [MobileNetV1(0.25, 10) for _ in range(2)]
    for m in models:
        m.load_state_dict(initial.state_dict())
    optimizers = [make(m, name, impl, lr=0.01, weight_decay=1e-4)[0]
                  for m, impl in zip(models, ("standard", "fused"))]
    data = torch.Generator().manual_seed(1)
    for _ in range(8):
        images = torch.randn(8, 3, 32, 32, generator=data)
        labels = torch.randint(0, 10, (8,), generator=data)
        torch.nn.functional.cross_entropy(models[0](images), labels).backward()
        for p, q in zip(models[0].parameters(), models[1].parameters()):
            q.grad = p.grad.clone()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    assert_same_weights(*(dict(m.named_parameters()) for m in (*models, initial)))


@pytest.mark.parametrize("name,impl,expected", [
    ("sgd", "standard", "SGD (per-parameter loop, foreach=False)"),
    ("sgd", "fused", "SGD (fused kernel)"),
    ("adamw", "fused", "AdamW (fused kernel)"),
    ("rmsprop", "fused", "RMSprop (multi-tensor foreach; RMSprop has no fused kernel, so --optimizer fused runs this)"),
])
def test_implementation_per_impl_on_cpu(name, impl, expected):
    _, implementation = make(MobileNetV1(0.25, 10), name, impl, lr=0.1)
    assert describe_optimizer(name, implementation, impl) == expected


class SignSGD(torch.optim.Optimizer):
    """A class outside torch's, that takes neither foreach nor fused."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-float(group["lr"]))


def test_an_algorithm_is_one_entry_even_a_class_without_foreach_or_fused(monkeypatch, tmp_path, digits):
    from mobilenet.optim import Algorithm
    monkeypatch.setitem(ALGORITHMS, "signsgd", Algorithm(SignSGD, {}, kernels=()))
    out = tmp_path / "run"
    assert train.main(["--config", "configs/demo.yaml", *TINY, "--data", str(digits), "--output", str(out),
                       "optim.name=signsgd", "--optimizer", "fused", "--epochs", "1", "train.max_steps=3"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["optimizer_implementation"] == "plain"
    assert summary["optimizer_class"] == ("SignSGD (its own step: it takes neither foreach nor fused; SignSGD has no "
                                          "fused kernel, so --optimizer fused runs this)")


def optim_section(norm="auto", bias="auto"):
    return {"weight_decay": 1e-4, "norm_weight_decay": norm, "bias_weight_decay": bias}


def test_no_weight_decay_on_bn_and_bias():
    model = MobileNetV1()
    decays = parameter_decays(model, optim_section(norm=0.0, bias=0.0))
    groups = build_optimizer(model, weight_decay=1e-4, decays=decays).param_groups
    assert [g["weight_decay"] for g in groups] == [1e-4, 0.0]
    assert len(groups[0]["params"]) == 28  # 27 conv weights + fc weight
    assert len(groups[1]["params"]) == 55  # 27 BN (weight, bias) pairs + fc bias
    sgd, _ = train_steps("standard", "sgd", decays=lambda net: parameter_decays(net, optim_section(0.0, 0.0)))
    assert sgd is not None


@pytest.mark.parametrize("norm,bias,expected", [
    ("auto", "auto", {1e-4: 83}),
    (0.0, "auto", {1e-4: 29, 0.0: 54}),   # a BN layer's bias is the layer's; the fc bias decays
    ("auto", 0.0, {1e-4: 55, 0.0: 28}),   # every bias, BN's too
    (0.0, 2e-5, {1e-4: 28, 0.0: 27, 2e-5: 28})])
def test_norm_and_bias_weight_decay_split_as_the_references_do(norm, bias, expected):
    model = MobileNetV1()
    groups = build_optimizer(model, decays=parameter_decays(model, optim_section(norm, bias))).param_groups
    assert {g["weight_decay"]: len(g["params"]) for g in groups} == expected


@pytest.mark.parametrize("name,cls", [("sgd", "NpuFusedSGD"), ("adam", "NpuFusedAdam"),
                                      ("adamw", "NpuFusedAdamW"), ("rmsprop", "NpuFusedRMSprop")])
def test_npu_fused_selection_with_stand_in(monkeypatch, name, cls):
    monkeypatch.setitem(sys.modules, "torch_npu", standin_torch_npu)
    model = MobileNetV1(0.25, 10)
    optimizer, implementation = make(model, name, "fused", device="npu", lr=0.1)
    assert type(optimizer).__name__ == cls and implementation == "npu_fused"
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    # the stand-in raises ValueError on set_to_none=True, as NpuFused does
    optimizer.zero_grad(set_to_none=IMPLEMENTATIONS[implementation].grads_to_none)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    standard, _ = make(model, name, "standard", device="npu", lr=0.1)
    assert type(standard).__module__ == "torch.optim." + type(standard).__name__.lower()


def schedule(name, **settings):
    return {**DEFAULTS["schedule"], "name": name, **settings}


def test_step_schedule_is_the_modelzoo_recipe():
    factor = lr_factor_fn(schedule("step", step_epochs=30, gamma=0.1), steps_per_epoch=10, epochs=90, base_lr=1.0)
    assert [factor(e * 10) for e in (0, 29, 30, 59, 60, 89)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01])


def test_warmup_then_cosine():
    factor = lr_factor_fn(schedule("cosine", warmup_epochs=2, warmup_start_factor=0.1, min_lr=0.001),
                          steps_per_epoch=10, epochs=10, base_lr=0.1)
    assert factor(0) == pytest.approx(0.1)
    assert factor(10) == pytest.approx(0.55)
    assert factor(20) == pytest.approx(1.0)
    assert factor(60) == pytest.approx(0.01 + 0.99 * 0.5)
    assert factor(100) == pytest.approx(0.01)
    assert all(factor(s) >= factor(s + 1) for s in range(20, 100))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_resumed_at_any_step_gives_the_straight_runs_lr(name):
    """A row of SCHEDULES is a closed form of the step: a scheduler moved to step k (a resume,
    schedule_at) gives the straight run's LR at k and every step after, with a warm-up too."""
    cfg = schedule(name, warmup_epochs=1.5, step_epochs=2)
    def scheduler():
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
        return build_scheduler(optimizer, schedule=cfg, base_lr=0.4, steps_per_epoch=4, epochs=6)
    straight, lrs = scheduler(), []
    for _ in range(24):
        lrs.append(straight.get_last_lr()[0])
        straight.step()
    assert len(set(lrs)) > 3  # the schedule moves
    for at in (1, 5, 6, 13, 23):
        resumed = scheduler()
        resumed.load_state_dict(straight.state_dict())  # what a checkpoint holds, from another position
        schedule_at(resumed, at)
        for step in range(at, 24):
            assert resumed.get_last_lr()[0] == pytest.approx(lrs[step], rel=1e-12), (at, step)
            resumed.step()


def test_a_schedule_setting_the_schedule_does_not_take_is_said():
    cfg = resolve(build_config(ROOT / "configs" / "demo.yaml", ["schedule.name=cosine", "schedule.step_epochs=5"]))
    notes = cfg["derived"]["not_taken"]
    assert any(line.startswith("schedule.step_epochs=5: cosine does not take it") for line in notes), notes
