"""The advice behaviour (mobilenet/behaviours/advice.py): the bf16 hint and the data-wait hint."""
from PIL import Image
import json
import torch
import train
from conftest import ROOT, TINY


def test_bf16_hint_only_where_amx_pays():
    from mobilenet.behaviours.advice import bf16_hint
    from mobilenet.config import build_config, resolve

    def hint(features, *overrides, config="imagenet.yaml"):
        cfg = resolve(build_config(ROOT / "configs" / config, ["device=cpu", "amp.level=O0", *overrides]))
        return bf16_hint(cfg, features)
    line = hint(["AMX-BF16", "AVX512-BF16"])
    assert "1.61x" in line and "--amp O1 amp.dtype=bfloat16" in line and "img/s" not in line
    assert "1.33x" in hint(["AMX-BF16"], "model.width_mult=0.75")
    assert hint(["AVX512-BF16"]) is None                          # the vector units alone: no hint
    assert hint([]) is None
    assert hint(["AMX-BF16"], "model.resolution=192") is None      # paid only at 224 px
    assert hint(["AMX-BF16"], "model.width_mult=0.25") is None     # 1.05x
    assert hint(["AMX-BF16"], "data.batch_size=8") is None         # not measured below 32
    assert hint(["AMX-BF16"], "amp.level=O1", "amp.dtype=bfloat16") is None
    assert hint(["AMX-BF16"], config="demo.yaml") is None          # the demo model: 0.58x


def test_a_loader_that_stays_the_bottleneck_gets_one_hint(tmp_path, capsys):
    """Large JPEGs for a tiny model at 32 px: decoding, not the step, takes the time."""
    root = tmp_path / "data"
    for subset in ("train", "val"):
        for label in ("a", "b"):
            folder = root / subset / label
            folder.mkdir(parents=True)
            for i in range(8):
                noise = torch.randint(0, 256, (1500, 2000, 3), dtype=torch.uint8).numpy()
                Image.fromarray(noise).save(folder / f"{i}.JPEG", quality=95)
    out = tmp_path / "run"
    assert train.main(["--config", "configs/demo.yaml", "--data", str(root), "--output", str(out),
                       *TINY, "model.num_classes=2", "data.batch_size=2", "data.cache_mb=0",
                       "train.log_every=1", "--epochs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    hints = [line for line in lines if line.startswith("hint: the loop waited for data")]
    assert len(hints) == 1 and "prepare the data once (python scripts/prepare_data.py DIR DST" in hints[0]
    assert "(data.workers is 0, of" in hints[0]
    waits = [json.loads(r)["data_wait"] for r in (out / "metrics.jsonl").read_text().splitlines()
             if '"train"' in r]
    assert len(waits) == 8 and sum(w >= 0.3 for w in waits) >= 3


def test_the_data_wait_hint_is_said_once_a_run_even_when_the_wait_comes_back():
    """Slow, slow, slow, fast, slow, slow, slow: one hint (the count started again after the
    fast interval, and a demo on a 16-core machine said it three times)."""
    from mobilenet.behaviours.advice import DataWaitHint
    hint = DataWaitHint(workers=3, cores=16, preparable=False)
    slow, fast = DataWaitHint.SHARE + 0.1, 0.0
    said = [line for wait in [slow] * 3 + [fast] + [slow] * 3 if (line := hint.line(wait))]
    assert len(said) == 1 and "(data.workers is 3, of 16 usable: raise it)" in said[0] and "prepare" not in said[0]
