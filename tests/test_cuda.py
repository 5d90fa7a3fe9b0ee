"""The device paths on cuda: each optimizer implementation and amp level trains, saves and resumes
through train.py. Marked cuda: they run where torch sees a GPU (scripts/bench_device.sh runs them
with pytest -m cuda) and are skipped elsewhere."""
import json

import pytest
import torch

import train
from mobilenet.checkpoint import load_checkpoint

pytestmark = pytest.mark.cuda

SMALL = ["--device", "cuda", "model.width_mult=0.25", "model.resolution=32", "data.batch_size=32", "data.workers=2",
         "train.log_every=3", "train.max_steps_per_epoch=6"]
CASES = {"torch_fused O1 bfloat16": ["--optimizer", "fused", "--amp", "O1", "amp.dtype=bfloat16"],
         "torch_fused O1 float16, dynamic scale": ["--optimizer", "fused", "--amp", "O1"],
         "torch_fused O2 float16": ["--optimizer", "fused", "--amp", "O2", "amp.loss_scale=1024"],
         "loop O2 float16": ["--optimizer", "standard", "optim.foreach=false", "--amp", "O2"],
         "foreach O0": ["--optimizer", "standard"]}


def train_digits(digits, out, *extra):
    assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out),
                       *SMALL, *extra]) == 0
    return json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None


@pytest.mark.parametrize("case", list(CASES))
def test_trains_saves_and_resumes_on_cuda(tmp_path, digits, case):
    straight = train_digits(digits, tmp_path / "straight", *CASES[case], "--epochs", "2")
    assert straight["device"] == "cuda" and straight["epochs"] == 2 and straight["img_per_s"] > 0
    train_digits(digits, tmp_path / "resumed", *CASES[case], "--epochs", "2", "train.max_steps=6")
    train_digits(digits, tmp_path / "resumed", *CASES[case], "--epochs", "2", "--resume", "auto")
    a, b = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt") for run in ("straight", "resumed"))
    assert (a["epoch"], a["epoch_step"]) == (b["epoch"], b["epoch_step"]) == (2, 0)
    for key, value in a["state_dict"].items():  # fp32 (the masters under O2); cuDNN's backward
        assert value.dtype == b["state_dict"][key].dtype  # kernels may sum in another order
        if value.is_floating_point():
            assert value.dtype == torch.float32, key
            torch.testing.assert_close(value, b["state_dict"][key], rtol=1e-3, atol=1e-3, msg=key)


def overflow_leaves_the_state(device, implementation):
    """Two clean O1 float16 steps, then one whose grads hold an inf (test_amp's step): returns
    (weights and momentum before, after) the skipped step."""
    from test_amp import amp_cfg, step

    from mobilenet.amp import build_precision
    from mobilenet.model import MobileNetV1
    from mobilenet.optim import build_optimizer
    torch.manual_seed(0)
    model = MobileNetV1(0.25, 10).to(device)
    precision = build_precision(amp_cfg("O1", loss_scale=1024), backend="native", device=device, net=model,
                                skip_on_device=implementation == "torch_fused")
    optimizer = build_optimizer(precision.params(model), implementation=implementation, lr=0.1, momentum=0.9)
    for _ in range(2):
        step(model, precision, optimizer)

    def state():
        return [t.detach().clone() for t in model.parameters()] + \
            [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    before = state()
    step(model, precision, optimizer, inject_inf=True)
    return before, state()


@pytest.mark.parametrize("implementation", ["torch_fused", "loop"])
def test_an_overflow_step_leaves_weights_and_momentum_unchanged_on_cuda(implementation):
    """torch's CUDA fused SGD was reported (torch 2.11) to advance momentum on a step it skips for
    found_inf; the app relies on it leaving everything as it was (checked on cpu in test_amp)."""
    before, after = overflow_leaves_the_state(torch.device("cuda"), implementation)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_device_id_picks_the_card_of_a_single_process(tmp_path, digits, capsys):
    """ModelZoo's --device_id N on a machine with cards: this one process trains on cuda:N (the log
    names the card, and the memory the run took is on that card)."""
    last = torch.cuda.device_count() - 1
    torch.cuda.reset_peak_memory_stats(last)
    capsys.readouterr()
    summary = train_digits(digits, tmp_path / "run", f"--device_id={last}", "--epochs", "1",
                           "train.max_steps=2")
    assert f"device cuda:{last} (" in capsys.readouterr().out
    assert summary["device"] == "cuda" and torch.cuda.max_memory_allocated(last) > 0
    assert summary["peak_memory_mb"] == pytest.approx(torch.cuda.max_memory_allocated(last) / 2**20, abs=0.1)


def test_device_decode_trains_on_cuda_and_auto_says_what_its_probe_found(tmp_path, digits, capsys):
    """data.decode=device decodes with nvJPEG on the card (unrun until a GPU is lent); auto says
    which way its start-up probe went, and config.yaml keeps auto beside the choice."""
    summary = train_digits(digits, tmp_path / "device", "data.decode=device", "--epochs", "1", "train.max_steps=4")
    assert summary["top1"] >= 0
    capsys.readouterr()
    train_digits(digits, tmp_path / "auto", "--epochs", "1", "train.max_steps=2")
    said = capsys.readouterr().out
    assert ("data.decode device (auto: the probe decoded" in said
            or "data.decode workers (auto: the probe" in said)
    config = (tmp_path / "auto" / "config.yaml").read_text()
    assert "decode: auto" in config and "decode_why:" in config
