"""Benchmarks and measurement tools run for real; speed is reported, never asserted."""
import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, TINY
from test_tools import script
import train


def benchmark(name):
    """scripts/benchmarks/NAME.py as scripts/bench.py NAME loads it."""
    return script("bench").load(name)


def test_bench_optimizer_counts_ops(tmp_path, capsys):
    out = tmp_path / "optimizer.json"
    benchmark("optimizer").main(["--width", "0.25", "--iterations", "2", "--rounds", "2",
                                    "--device", "cpu", "--json", str(out)])
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"loop", "foreach", "torch_fused"}
    assert rows["loop"]["ops_per_step"] >= 83 * 3  # several ops per tensor
    assert rows["torch_fused"]["ops_per_step"] * 50 <= rows["loop"]["ops_per_step"]
    assert rows["foreach"]["ops_per_step"] < rows["loop"]["ops_per_step"]
    assert all(r["ms_per_step"] > 0 for r in rows.values())
    assert "| SGD (fused kernel) |" in capsys.readouterr().out


def test_compare_optimizers_writes_table_json_and_plot(tmp_path, digits):
    out = tmp_path / "compare"
    result = subprocess.run(["bash", "scripts/compare_optimizers.sh", "--config", "configs/demo.yaml",
                             "--data", str(digits),
                             "--epochs", "1", *TINY, "train.max_steps_per_epoch=6"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COMPARE_OUT": str(out)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| ops per optimizer step |" in result.stdout
    assert "| optimizer share of step (run with device syncs) |" in result.stdout
    for run in ("loop", "foreach", "fused"):  # throughput from runs without syncs, the breakdown apart
        plain, synced = (json.loads((out / name / "summary.json").read_text()) for name in (run, f"{run}-breakdown"))
        assert "optimizer_ms" not in plain and synced["optimizer_ms"] > 0
    report = json.loads((out / "report.json").read_text())
    assert report["loop"]["img_per_s"] == json.loads((out / "loop" / "summary.json").read_text())["img_per_s"]
    # the runs are named by what selects them: --optimizer fused runs torch's fused kernel here
    assert [report[run]["optimizer_implementation"] for run in ("loop", "foreach", "fused")] == \
        ["loop", "foreach", "torch_fused"]
    assert report["ratio"]["optimizer_ops_per_step"] <= 1 / 50  # fused / loop
    assert report["ratio_foreach"]["optimizer_ops_per_step"] < 1
    assert 0 < report["loop"]["optimizer_share"] < 1 and 0 <= report["fused"]["data_wait_share"] < 1
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run in ("loop", "foreach", "fused"):  # side by side under one TensorBoard logdir
        assert list((out / run).glob("events.out.tfevents.*"))


def test_profile_writes_a_trace(tmp_path, digits):
    out = tmp_path / "run"
    assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out),
                       *TINY, "train.max_steps_per_epoch=14", "--epochs", "1", "--profile"]) == 0
    traces = list((out / "profile").glob("*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in events) == 10
    report = script("trace_report").main([str(out / "profile"), "--json", str(tmp_path / "trace.json")])
    phases = report["phases"]  # the step's phases are ranges in the trace, the loop's wait for data too
    assert report["steps"] == 10 and all(phases[p]["host_ms"] > 0 for p in ("data", "forward", "backward", "optimizer"))
    assert report["host_waits_per_step"] == 0 and json.loads((tmp_path / "trace.json").read_text()) == report


def test_bench_data_runs(tmp_path, capsys):
    out = tmp_path / "data.json"
    benchmark("data").main(["--images", "6", "--rounds", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    names = {"torchvision default", "torchvision fast", "this app"}
    assert set(result["img_per_s"]) == set(result["ratio"]) == names and result["ratio"]["this app"] == 1
    assert len(result["rounds"]) == len(result["other_cpu_share"]) == 2
    assert all(0 <= share <= 1 for share in result["other_cpu_share"])
    assert "| this app |" in capsys.readouterr().out


def test_bench_feed_runs_every_part_on_imagenet_like_photos(tmp_path, capsys):
    """bench.py feed, small: the photos' mix, the cost by stage (the prepared set's per image below
    the folder's), each augmentation's against the crop's, the feed by loader workers, training from
    each source and decode against synthetic."""
    out = tmp_path / "feed.json"
    report = benchmark("feed").main(["--images", "32", "--resolution", "32", "--batch-size", "8", "--steps", "2",
                                     "--rounds", "1", "--max-sides", "256", "--json", str(out), "model.width_mult=0.25",
                                     "amp.level=O0", "device=cpu"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert set(report["cost"]) == {"folder", "prepared", "prepared 256"}
    assert set(report["cost"]["folder"]) == {"read", "decode", "crop/resize", "collation"}
    assert report["cost_ratio"]["prepared"] > 1  # quality 96, 4:4:4, 500x375 and more, against 384 px 4:2:0
    assert set(report["augment"]) == {"decode, crop and flip", "+ imagenet", "+ cifar10", "+ svhn", "+ ra",
                                      "+ ta_wide", "+ augmix", "+ random erasing",
                                      "+ mixup (on the batch; on the host here)",
                                      "+ cutmix (on the batch; on the host here)"}
    assert report["augment"]["+ augmix"]["vs_crop"][0] > 1  # four chains of ops cost more than the crop alone
    assert {key.split("|")[1] for key in report["feed"]} >= {"0", "1"}
    assert set(report["training"]) == {"synthetic", "folder, decode workers", "folder, decode device",
                                       "prepared, decode workers", "prepared, decode device"}
    assert all(0 <= run["data_wait"] <= 1 and run["img_per_s"] > 0 for run in report["training"].values())
    printed = capsys.readouterr().out
    assert '"CMYK"' in printed and "| folder | 0 |" in printed


def test_ceiling_compares_the_app_with_plain_loops_on_the_same_loader(tmp_path, capsys):
    """The suite's share of bench.py ceiling: its eager variants on the cpu at a tiny size."""
    out = tmp_path / "ceiling.json"
    rows = benchmark("ceiling").main(["--device", "cpu", "--cases", "eager/8/O1-bfloat16/torch_fused",
                                      "eager/8/O2-float16/loop", "--steps", "6", "--log-every", "3",
                                      "--rounds", "1", "--json", str(out), "model.width_mult=0.25",
                                      "model.resolution=32", "model.num_classes=10"])
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(rows)) and len(rows) == 2
    for row in rows:
        assert set(row["img_per_s"]) == {"app", "plain loader", "plain static"}
        assert all(rate > 0 for rate in row["img_per_s"].values()) and 0 < row["app/plain static"][0] < 10
    printed = capsys.readouterr().out
    assert "| eager b8 O2 float16 loop |" in printed and "intervals 2-2 of 3 steps" in printed


def test_no_benchmark_reports_a_warm_up_rate(digits):
    from mobilenet.errors import UsageError
    from benchmarks.harness import training_img_per_s
    settings = [*TINY, f"data.path={digits}"]
    with pytest.raises(UsageError, match="held .* of the 48 steps this measurement needs"):
        training_img_per_s(ROOT / "configs" / "demo.yaml", [*settings, "data.batch_size=256"],
                           steps=48, log_every=8)  # the digits hold 5 batches of 256
    with pytest.raises(UsageError, match="the first interval is the warm-up"):
        training_img_per_s(ROOT / "configs" / "demo.yaml", settings, steps=4, log_every=4)
    for wrong in (["ceiling", "--cases", "eager/8/O9-float16/loop"],
                  ["ceiling", "--cases", "graphed/8/O1-float16/loop"]):
        result = subprocess.run([sys.executable, "scripts/bench.py", *wrong], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--cases" in result.stderr


def test_op_budget_table_is_consistent(tmp_path, capsys):
    from mobilenet.measure import PHASES
    out = tmp_path / "ops.json"
    rows = benchmark("ops").main(["--width", "0.25", "--resolution", "32", "--levels", "O0", "O1",
                                     "--ema-decay", "0.9", "--json", str(out)])
    assert json.loads(out.read_text())["rows"] == rows and len(rows) == 6
    for row in rows:
        assert all(isinstance(row[p], int) and row[p] >= 0 for p in PHASES)
        assert sum(row[p] for p in PHASES) == row["total"]
        assert row["forward"] > 0 and row["backward"] > 0 and row["ema"] > 0 and row["input"] > 0
    by = {(r["implementation"], r["amp"]): r for r in rows}
    for level in ("O0", "O1"):
        fused, foreach, loop = (by[implementation, level] for implementation in ("torch_fused", "foreach", "loop"))
        assert fused["optimizer"] < foreach["optimizer"] < loop["optimizer"]
        assert loop["optimizer"] >= 83 * 3 and fused["total"] < loop["total"]
    assert by["loop", "O1"]["unscale"] > 0 == by["loop", "O0"]["unscale"]
    assert "| torch_fused | O1 |" in capsys.readouterr().out


def test_host_model_and_amp_table_and_pipeline_run(tmp_path, capsys):
    model = benchmark("host-model").main(["--width", "0.25", "--resolution", "64", "--batches", "1", "4",
                                       "--rounds", "1", "--json", str(tmp_path / "model.json")])
    assert [r["batch"] for r in model] == [1, 4] and all(r["predicted_ratio"] > 1 for r in model)
    assert json.loads((tmp_path / "model.json").read_text())["host_bound_ceiling"] > 1
    amp = benchmark("amp").main(["--models", "demo", "--levels", "O0", "O1", "--rounds", "1", "--steps", "8",
                                    "--json", str(tmp_path / "amp.json")])
    assert len(amp) == 4 and all(r["img_per_s"] > 0 for r in amp)
    assert {r["vs_O0"] for r in amp if r["amp"] == "O0"} == {1.0}
    pipeline = benchmark("pipeline").main(["--steps", "12", "--rounds", "1", "data.path=digits"])
    assert set(pipeline["ratio"]) == {"from memory", "end to end"} and pipeline["ratio"]["from memory"] == 1
    assert "seed article" in capsys.readouterr().out


def test_one_entry_point_runs_each_benchmark(tmp_path):
    result = subprocess.run([sys.executable, "scripts/bench.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    names = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    files = sorted(p.stem.replace("_", "-") for p in (ROOT / "scripts" / "benchmarks").glob("*.py")
                   if p.stem != "harness")
    assert result.returncode == 0 and sorted(names) == files
    wrong = subprocess.run([sys.executable, "scripts/bench.py", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert wrong.returncode == 2 and wrong.stderr.startswith("error: no benchmark 'nope'")
    out = tmp_path / "ema.json"
    ema = subprocess.run([sys.executable, "scripts/bench.py", "ema", "--steps", "2", "--rounds", "1", "--json",
                          str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ema.returncode == 0, ema.stderr[-2000:]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["torch_fused, EMA app"]["ema_ops"] == 2 and rows["torch_fused, EMA torch"]["ema_ops"] > 100
    assert "usage: bench.py ema" in subprocess.run([sys.executable, "scripts/bench.py", "ema", "--help"], cwd=ROOT,
                                                   capture_output=True, text=True).stdout


def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_the_other_processes_share_leaves_out_this_processs_own_children():
    """A loader worker is a child of the run: its CPU is the run's own, not another process's (a
    run with busy workers reported 8-13% 'other' load on an idle machine)."""
    from mobilenet.measure import OtherLoad
    worker = multiprocessing.get_context("fork").Process(target=busy, args=(1.5,))
    with OtherLoad() as load:
        worker.start()
        time.sleep(1.0)  # measured while the worker lives and spins (a core of the machine's)
        share_while_alive = load.so_far()
    worker.join()
    assert share_while_alive < 0.5 / os.cpu_count(), share_while_alive
