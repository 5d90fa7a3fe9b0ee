"""scripts/model_info.py, validate.py, export_onnx.py, the recipes and EMA."""
import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, TINY
from mobilenet.checkpoint import load_checkpoint
from mobilenet.config import build_config
from mobilenet.model import MobileNetV1


def script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Howard et al. 2017, Tables 6 and 7: (width, resolution) -> (million mult-adds, million params)
PAPER = {(1.0, 224): (569, 4.2), (0.75, 224): (325, 2.6), (0.5, 224): (149, 1.3),
         (0.25, 224): (41, 0.5), (1.0, 192): (418, 4.2), (1.0, 160): (290, 4.2),
         (1.0, 128): (186, 4.2)}


@pytest.mark.parametrize("width,resolution", PAPER)
def test_model_info_matches_the_paper(width, resolution, capsys):
    script("model_info").main(["--width", str(width), "--resolution", str(resolution)])
    out = capsys.readouterr().out
    params, macs = (int(n.replace(",", "")) for n in
                    (out.split(": ")[1].split(" parameters")[0], out.split("), ")[1].split(" ")[0]))
    paper_macs, paper_params = PAPER[width, resolution]
    assert macs / 1e6 == pytest.approx(paper_macs, rel=0.005)
    assert round(params / 1e6, 1) == paper_params


def test_export_onnx_matches_torch(tmp_path):
    import onnx
    import onnxruntime

    torch.manual_seed(0)
    model = MobileNetV1(0.25, 10)
    for m in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2)
    checkpoint = tmp_path / "model.pth.tar"
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, checkpoint)
    out = tmp_path / "model.onnx"
    assert script("export_onnx").main(["--checkpoint", str(checkpoint), "--output", str(out),
                                       "--resolution", "64", "--dynamic-batch"]) == 0
    graph = onnx.load(str(out))
    assert graph.opset_import[0].version == 11
    assert [i.name for i in graph.graph.input] == ["actual_input_1"]
    assert [o.name for o in graph.graph.output] == ["output1"]
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    images = torch.randn(3, 3, 64, 64)
    (ours,) = session.run(["output1"], {"actual_input_1": images.numpy()})
    expected = model.eval()(images).detach().numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=1e-4)


def test_validate_reads_our_and_modelzoo_checkpoints(tmp_path, digits, capsys):
    out = tmp_path / "run"
    assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out),
                       *TINY, "train.max_steps_per_epoch=10", "--epochs", "1"]) == 0
    top1 = json.loads((out / "summary.json").read_text())["top1"]
    ours = out / "checkpoints" / "last.pt"
    state = load_checkpoint(ours)
    zoo = tmp_path / "modelzoo.pth.tar"
    torch.save({"epoch": 1, "arch": "mobilenet", "best_prec1": top1, "optimizer": state["optimizer"],
                "state_dict": {f"module.{k}": v for k, v in state["state_dict"].items()}}, zoo)
    validate = script("validate")
    capsys.readouterr()
    for checkpoint in (ours, zoo):
        assert validate.main(["--checkpoint", str(checkpoint), "--data", str(digits),
                              "--resolution", "32", "--workers", "0"]) == 0
        assert capsys.readouterr().out.strip() == f"* Prec@1 {top1:.3f} Prec@5 " + \
            f"{json.loads((out / 'summary.json').read_text())['top5']:.3f}"
    assert validate.main(["--checkpoint", str(tmp_path / "none.pt"), "--data", str(digits)]) == 2
    data = tmp_path / "data"  # --data as train.py takes it; an unreadable image is left out, as training's is
    shutil.copytree(digits, data)
    next((data / "val" / "4").iterdir()).write_bytes(b"not an image")
    for where in ("digits", str(data)):
        assert validate.main(["--checkpoint", str(ours), "--data", where, "--resolution", "32", "--workers", "0"]) == 0
    assert capsys.readouterr().out.strip().endswith("(359 images, 1 unreadable left out)")


def test_ema_is_evaluated_checkpointed_and_resumed(tmp_path, digits):
    out = tmp_path / "run"
    base = ["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out), *TINY,
            "train.max_steps_per_epoch=5", "train.ema_decay=0.9"]
    assert train.main([*base, "--epochs", "1"]) == 0
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert int(state["ema"]["n_averaged"]) == 5
    assert not torch.equal(state["ema"]["module.fc.weight"], state["state_dict"]["fc.weight"])
    assert train.main([*base, "--epochs", "2", "--resume", "auto"]) == 0
    assert int(load_checkpoint(out / "checkpoints" / "last.pt")["ema"]["n_averaged"]) == 10
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["ema_top1"] <= 100
    val = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
           if '"val"' in line]
    assert all("ema_top1" in r for r in val)


@pytest.mark.parametrize("name", ["imagenet", "modern", "synthetic", "demo"])
def test_recipes_are_valid(name):
    cfg = build_config(ROOT / "configs" / f"{name}.yaml")
    if name == "imagenet":  # the ModelZoo recipe
        o, s = cfg["optim"], cfg["schedule"]
        assert (o["lr"], o["lr_scale_batch"], cfg["data"]["batch_size"]) == (0.1, 256, 256)
        assert (s["name"], s["step_epochs"], cfg["train"]["epochs"]) == ("step", 30, 90)
        assert (cfg["amp"]["level"], cfg["amp"]["loss_scale"], o["impl"]) == ("O2", 1024, "fused")
        assert (o["momentum"], o["weight_decay"]) == (0.9, 1e-4)
