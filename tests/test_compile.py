"""train.compile: the model's forward and backward under torch.compile (inductor on cpu)."""
import json

import pytest
import torch

import standin_apex
import train
from conftest import ROOT, TINY, assert_same_weights
from mobilenet.checkpoint import load_checkpoint
from mobilenet.config import build_config, resolve
from mobilenet.errors import UsageError
from mobilenet.training import build_train_step


def steps_of(compile_, impl, level, batches):
    """The TrainStep of the demo recipe after ``batches``, and its losses; at O0 in float64, where
    float32 rounding (which inductor's fused kernels do in another order) cannot hide a wrong
    graph behind the tiny model's ill-conditioned BatchNorm gradients."""
    cfg = resolve(build_config(ROOT / "configs" / "demo.yaml", [
        "device=cpu", "optim.lr=0.01", f"train.compile={str(compile_).lower()}", f"amp.level={level}",
        "amp.dtype=bfloat16", "amp.backend=native",
        *(["optim.impl=fused"] if impl == "fused" else ["optim.foreach=false"])]))
    torch.manual_seed(0)
    dtype = torch.float64 if level == "O0" else torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the model is built in it, and the app's LR tensors follow it
    try:
        step = build_train_step(cfg, torch.device("cpu"))
    finally:
        torch.set_default_dtype(default)
    step.train()
    losses = [float(step(images.to(dtype), labels)) for images, labels in batches]
    return step, losses


@pytest.mark.parametrize("impl,level", [("loop", "O0"), ("fused", "O0"), ("loop", "O1"), ("fused", "O1")])
def test_compiled_step_agrees_with_eager(impl, level):
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 3, 32, 32, generator=generator).contiguous(memory_format=torch.channels_last),
                torch.randint(0, 10, (16,), generator=generator)) for _ in range(3)]
    eager, eager_losses = steps_of(False, impl, level, batches)
    compiled, compiled_losses = steps_of(True, impl, level, batches)
    assert compiled.wrapped is not compiled.net and eager.wrapped is eager.net
    if level == "O0":  # float64: the same function to rounding
        torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-9, atol=1e-9)
        for (key, a), b in zip(eager.net.state_dict().items(), compiled.net.state_dict().values()):
            torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9, msg=key)
    else:  # bfloat16 autocast: inductor keeps fused intermediates in float32, eager rounds each op
        torch.testing.assert_close(compiled_losses, eager_losses, rtol=2e-2, atol=2e-2)


def test_the_lr_schedule_reaches_the_compiled_optimizer_without_recompiling():
    from torch._dynamo.utils import counters
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(16, 3, 32, 32, generator=generator).contiguous(memory_format=torch.channels_last),
             torch.randint(0, 10, (16,), generator=generator))
    step, _ = steps_of(True, "fused", "O1", [batch] * 2)  # the graph of the test above: inductor's cache has it
    lr = step.optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.dtype == torch.float32  # build_train_step made it
    scheduler = torch.optim.lr_scheduler.LambdaLR(step.optimizer, lambda i: 1 / (i + 1))
    compiled_before = counters["stats"]["unique_graphs"]
    weights = step.net.fc.weight.detach().clone()
    for _ in range(3):
        step(*batch)
        scheduler.step()
    assert counters["stats"]["unique_graphs"] == compiled_before  # the LR changed three times
    assert step.optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.01 / 4)
    assert not torch.equal(weights, step.net.fc.weight)


def test_compiled_run_resumes_bit_identical_with_plain_checkpoint_keys(tmp_path, digits, capsys):
    base = ["--config", "configs/demo.yaml", "--data", str(digits), *TINY, "--compile", "--grad-accum-steps", "2",
            "train.max_steps_per_epoch=6",  # the compiled step accumulates two forwards
            # the model, batch and precision of test_compiled_step_agrees_with_eager[fused-O1]: its graphs
            "data.batch_size=16", "amp.level=O1", "amp.dtype=bfloat16", "amp.backend=native", "optim.impl=fused"]
    assert train.main([*base, "--output", str(tmp_path / "straight"), "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "compile: the first 2 steps took" in out and "img/s" not in out.split("compile:")[1].splitlines()[0]
    assert train.main([*base, "--output", str(tmp_path / "resumed"), "--epochs", "1"]) == 0
    assert train.main([*base, "--output", str(tmp_path / "resumed"), "--epochs", "2", "--resume", "auto"]) == 0
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    state = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    assert not any("_orig_mod" in key for key in state["state_dict"])
    assert type(state["optimizer"]["param_groups"][0]["lr"]) is float  # as an eager run writes it
    assert all(type(lr) is float for lr in state["scheduler"]["base_lrs"])
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["img_per_s"] > 0
    # the compiled run's checkpoint evaluates in an eager process
    assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), *TINY, "--evaluate",
                       "--output", str(tmp_path / "eval"),
                       "--resume", str(tmp_path / "straight" / "checkpoints" / "last.pt")]) == 0
    assert f"* Prec@1 {summary['top1']:.3f}" in capsys.readouterr().out


def test_settings_that_cannot_compile_are_usage_errors(monkeypatch):
    standin_apex.install(monkeypatch)
    with pytest.raises(UsageError, match="train.compile=true: apex amp"):
        resolve(build_config(None, ["train.compile=true", "amp.level=O1", "amp.backend=apex", "device=cpu"]))
    auto = resolve(build_config(None, ["amp.level=O1", "amp.backend=apex",
                                       "device=cuda" if torch.cuda.is_available() else "device=cpu"]))
    assert auto["derived"]["compile"] is None and "apex" in auto["derived"]["compile_why"]  # auto resolves
    with pytest.raises(UsageError, match="train.measure_breakdown"):
        resolve(build_config(None, ["train.compile=true", "train.measure_breakdown=true", "device=cpu"]))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(UsageError, match="C\\+\\+ compiler"):
        resolve(build_config(None, ["train.compile=true", "device=cpu"]))
