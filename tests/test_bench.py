"""Benchmarks and measurement tools run for real; speed is reported, never asserted."""
import json
import os
import subprocess

import torch
from PIL import Image

from conftest import ROOT, TINY
from test_tools import script
from mobilenet.data import DraftRandomResizedCrop
import train


def test_bench_optimizer_counts_ops(tmp_path, capsys):
    out = tmp_path / "optimizer.json"
    script("bench_optimizer").main(["--width", "0.25", "--iterations", "2", "--repeats", "1",
                                    "--device", "cpu", "--json", str(out)])
    rows = {r["variant"].split()[0]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["standard"]["ops_per_step"] >= 83 * 3  # several ops per tensor
    assert rows["fused"]["ops_per_step"] * 50 <= rows["standard"]["ops_per_step"]
    assert rows["foreach"]["ops_per_step"] < rows["standard"]["ops_per_step"]
    assert all(r["ms_per_step"] > 0 for r in rows.values())
    assert "| fused (fused=True) |" in capsys.readouterr().out


def test_compare_optimizers_writes_table_json_and_plot(tmp_path, digits):
    out = tmp_path / "compare"
    result = subprocess.run(["bash", "scripts/compare_optimizers.sh", "--config", "configs/demo.yaml",
                             "--data", str(digits),
                             "--epochs", "1", *TINY, "train.max_steps_per_epoch=6"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COMPARE_OUT": str(out)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| ops per optimizer step |" in result.stdout and "| optimizer share of step |" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["standard"]["optimizer"] == "standard" and report["fused"]["optimizer"] == "fused"
    assert report["ratio"]["optimizer_ops_per_step"] <= 1 / 50
    assert 0 < report["standard"]["optimizer_share"] < 1 and 0 <= report["fused"]["data_wait_share"] < 1
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run in ("standard", "fused"):  # side by side under one TensorBoard logdir
        assert list((out / run).glob("events.out.tfevents.*"))


def test_profile_writes_a_trace(tmp_path, digits):
    out = tmp_path / "run"
    assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out),
                       *TINY, "train.max_steps_per_epoch=8", "--epochs", "1", "--profile"]) == 0
    traces = list((out / "profile").glob("*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("ProfilerStep#" in e.get("name", "") for e in events)


def test_draft_crop_decodes_large_jpegs_small_with_the_same_result(tmp_path):
    path = tmp_path / "big.JPEG"
    gradient = torch.linspace(0, 255, 2000).to(torch.uint8)
    pixels = torch.stack([gradient.expand(1500, 2000), gradient.flip(0).expand(1500, 2000),
                          torch.full((1500, 2000), 90, dtype=torch.uint8)], dim=2)
    Image.fromarray(pixels.numpy()).save(path, quality=95)
    crop = DraftRandomResizedCrop(224, scale=(0.9, 1.0))
    torch.manual_seed(3)
    with Image.open(path) as image:
        fast = crop(image)
        assert image.size[0] <= 1000  # decoded at 1/2 or less
    torch.manual_seed(3)
    with Image.open(path) as image:
        top, left, h, w = crop.get_params(image, crop.scale, crop.ratio)
        full = image.convert("RGB").resize((224, 224), Image.BILINEAR, box=(left, top, left + w, top + h))
    from torchvision.transforms.functional import pil_to_tensor
    difference = (pil_to_tensor(fast).float() - pil_to_tensor(full).float()).abs()
    assert fast.size == (224, 224) and difference.mean() < 2.0


def test_bench_data_runs(tmp_path, capsys):
    out = tmp_path / "data.json"
    script("bench_data").main(["--images", "6", "--repeats", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert set(result["img_per_s"]) == {"torchvision default", "this app"} and result["ratio"] > 0
    assert "| this app |" in capsys.readouterr().out
