"""The commands users already type: the seed article's, pytorch/examples' main.py flags, Ascend
ModelZoo's main.py flags and its test scripts."""
import os
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT, run_train, train_sh
from mobilenet.cli import REFUSED, build_parser, config_from_args
from mobilenet.config import thaw
from mobilenet.errors import UsageError

MODELZOO = ROOT / "scripts" / "modelzoo"


def resolved(argv, processes=1, monkeypatch=None):
    """The settings (config.yaml without the derived section's command-line notes) of ``argv``."""
    if monkeypatch is not None:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    cfg = thaw(config_from_args(build_parser().parse_intermixed_args(argv)))
    notes = cfg["derived"].pop("command_line")
    return cfg, notes


@pytest.mark.parametrize("impl", ["standard", "fused"])
def test_seed_article_commands_verbatim(tmp_path, impl):
    out = tmp_path / impl
    result = train_sh(f"--optimizer={impl}", "--batch-size=256", "--output", out, "train.max_steps=3")
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["data"]["batch_size"] == 256 and config["optim"]["impl"] == impl
    assert config["train"]["max_steps"] == 3
    note = "-b/--batch-size 256 for the node = data.batch_size 256 per process x 1"
    assert config["derived"]["command_line"] == [note]
    assert f"command line: {note}" in result.stdout
    assert yaml.safe_load((out / "summary.json").read_text())["steps"] == 3


def test_pytorch_examples_command_equals_native_command(monkeypatch):
    examples, _ = resolved(["/data/imagenet", "-a", "mobilenet_v1", "-b", "128", "--lr", "0.05",
                            "--momentum", "0.8", "--wd", "4e-5", "-j", "6", "-p", "20", "--seed", "3",
                            "--epochs", "5", "--no-accel", "-e", "--resume", "x.pt"])
    native, _ = resolved(["--data", "/data/imagenet", "data.batch_size=128", "optim.lr=0.05",
                          "optim.lr_scale_batch=0", "optim.momentum=0.8", "optim.weight_decay=4e-5",
                          "data.workers=6", "train.log_every=20", "seed=3", "--epochs", "5",
                          "--device", "cpu"])
    assert examples == native
    assert examples["optim"]["lr"] == examples["derived"]["lr"] == 0.05  # no batch scaling on top


def test_node_totals_divide_among_the_nodes_processes(monkeypatch):
    cfg, notes = resolved(["--dummy", "-b", "256", "-j", "5"], processes=2, monkeypatch=monkeypatch)
    assert cfg["data"]["batch_size"] == 128 and cfg["data"]["workers"] == 3  # as main.py: ceil(5 / 2)
    assert cfg["data"]["path"] == "synthetic" and cfg["data"]["synthetic_size"] == 1024  # synthetic.yaml
    assert "-b/--batch-size 256 for the node = data.batch_size 128 per process x 2" in notes
    assert "-j/--workers 5 for the node = data.workers 3 per process x 2" in notes
    # -b without --lr keeps the recipe's LR rule
    imagenet, _ = resolved(["/imagenet", "-b", "512"], processes=2, monkeypatch=monkeypatch)
    assert imagenet["optim"]["lr_scale_batch"] == 256 and imagenet["data"]["batch_size"] == 256
    with pytest.raises(UsageError, match="-b/--batch-size 256: .* 3 processes .* multiple of 3"):
        resolved(["-b", "256"], processes=3, monkeypatch=monkeypatch)


def test_modelzoo_command_equals_native_command():
    modelzoo, _ = resolved(["--dummy", "-a", "MobileNet", "--apex", "--apex-opt-level", "O2",
                            "--loss-scale-value", "1024", "--max_steps", "100", "-b", "256",
                            "--lr", "0.1", "--wd", "1e-4", "--print-freq", "10"])
    native, _ = resolved(["--data", "synthetic", "--amp", "O2", "amp.loss_scale=1024",
                          "train.max_steps=100", "data.batch_size=256", "optim.lr=0.1",
                          "optim.lr_scale_batch=0", "optim.weight_decay=1e-4", "train.log_every=10"])
    assert modelzoo == native
    dynamic, notes = resolved(["--apex", "--opt-level", "O1", "--loss-scale-value", "-1",
                               "--stop-step-num", "7"])
    assert dynamic["amp"]["level"] == "O1" and dynamic["amp"]["loss_scale"] == "dynamic"
    assert dynamic["train"]["max_steps"] == 7
    assert resolved(["--apex"])[0]["amp"]["level"] == "O1"  # ModelZoo's default opt level


@pytest.mark.parametrize("argv,fragments", [
    (["-b", "256", "data.batch_size=64"], ["-b/--batch-size 256", "data.batch_size=64", "contradict"]),
    (["--lr", "0.1", "optim.lr_scale_batch=256"], ["--lr 0.1", "optim.lr_scale_batch=256"]),
    (["--dummy", "--data", "/imagenet"], ["--data", "--dummy", "contradict"]),
    (["/imagenet", "--data", "/other"], ["--data", "DIR", "contradict"]),
    (["--no-accel", "--device", "cuda"], ["--device", "--no-accel"]),
    (["--apex", "--amp", "O1", "--apex-opt-level", "O2"], ["--amp", "--apex"]),
    (["/a", "/b"], ["one data folder"]),
    (["-a", "resnet50"], ["-a/--arch resnet50", "MobileNetV1 only"]),
    (["--pretrained"], ["--pretrained", "model.pretrained=FILE"]),
    (["--apex-opt-level", "O2"], ["--apex-opt-level", "--apex"]),
    (["--loss-scale-value", "128"], ["--loss-scale-value", "--apex"]),
    (["--momentum", "1.5"], ["--momentum 1.5", "optim.momentum"]),
    (["--stop-step-num", "0"], ["--max_steps/--stop-step-num 0", "at least 1"]),
])
def test_dialect_mistakes_are_one_line_errors(tmp_path, argv, fragments):
    result = run_train(*argv, "--output", tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(fragment in lines[0] for fragment in fragments), lines[0]


def test_agreeing_flag_and_setting_are_accepted():
    cfg, _ = resolved(["-b", "64", "data.batch_size=64", "/imagenet", "data.path=/imagenet"])
    assert cfg["data"]["batch_size"] == 64 and cfg["data"]["path"] == "/imagenet"


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_each_refused_launcher_flag_names_what_to_run(tmp_path, flag):
    nargs = REFUSED[flag][0]
    result = run_train(flag, *["1"] * nargs, "--output", tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag}: train.py does not take it; ")
    assert "train.sh" in lines[0] or "--resume" in lines[0] or "--device" in lines[0]


@pytest.mark.parametrize("argv,fragment", [
    (["--gpu", "0,1"], "--gpu takes one card"),
    (["--gpu", "1", "--device-list", "0,1"], "--gpu and --device-list both choose the cards"),
    (["--device_list=0,1", "--nproc", "3"], "--nproc 3 and --device_list 0,1 (2 cards) contradict"),
    (["--addr", "10.0.0.1", "--master-addr", "10.0.0.2"], "--master-addr/--addr given twice"),
    (["--device-id", "x"], "--device-id needs card numbers"),
])
def test_train_sh_launcher_dialect_mistakes(argv, fragment):
    result = train_sh(*argv)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {result.stderr.strip()[7:]}"
    assert fragment in result.stderr and len(result.stderr.strip().splitlines()) == 1


def key_lines(case_log):
    return dict(line.split(" = ", 1) for line in case_log.read_text().splitlines())


def number(text):
    assert re.fullmatch(r"-?\d+(\.\d+)?", text), text
    return float(text)


def run_modelzoo(script, cwd, *args, card="97"):
    """A ModelZoo script, its outputs in output/<card>/ (a card number no user run takes)."""
    env = {**os.environ, "ASCEND_DEVICE_ID": card}
    return subprocess.run(["bash", str(MODELZOO / script), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture
def modelzoo_output():
    out = MODELZOO / "output" / "97"
    yield out
    shutil.rmtree(out, ignore_errors=True)


def test_modelzoo_performance_script_writes_their_outputs(tmp_path, modelzoo_output):
    """The issue's own command, from another working directory."""
    result = run_modelzoo("train_performance_1p.sh", tmp_path, "--data_path=synthetic",
                          "data.synthetic_size=256", "model.width_mult=0.25", "model.resolution=64")
    assert result.returncode == 0, result.stdout + result.stderr
    out = modelzoo_output
    case = "MobileNet_bs256_1p_perf"
    keys = key_lines(out / f"{case}.log")
    assert keys["Network"] == "MobileNet" and keys["CaseName"] == case and keys["DeviceType"]
    assert number(keys["RankSize"]) == 1 and number(keys["BatchSize"]) == 256
    fps = number(keys["ActualFPS"])
    assert fps > 0 and abs(number(keys["TrainingTime"]) - 256 * 1000 / fps) < 0.01
    assert number(keys["ActualLoss"]) > 0 and number(keys["E2ETrainingTime"]) >= 0
    assert "TrainAccuracy" not in keys
    assert (out / f"train_{case}_loss.txt").read_text().split() == [keys["ActualLoss"]]
    assert f"Final Performance images/sec : {keys['ActualFPS']}" in result.stdout
    assert re.search(r"E2E Training Duration sec : \d+", result.stdout)
    config = yaml.safe_load((out / "run" / "config.yaml").read_text())
    assert config["amp"]["level"] == "O2" and config["amp"]["loss_scale"] == 1024
    assert config["train"]["max_steps"] == 1000 and config["train"]["epochs"] == 1
    assert "img/s" in (out / "train_97.log").read_text()


def test_modelzoo_8p_full_script_on_two_listed_cards(tmp_path, modelzoo_output):
    result = run_modelzoo("train_full_8p.sh", tmp_path, "--data_path=synthetic", "--device_list=0,1",
                          "data.synthetic_size=512", "model.width_mult=0.25", "model.resolution=64",
                          "data.workers=1", "train.epochs=1")
    assert result.returncode == 0, result.stdout + result.stderr
    out = modelzoo_output
    keys = key_lines(out / "MobileNet_bs512_2p_acc.log")
    assert number(keys["RankSize"]) == 2 and number(keys["BatchSize"]) == 512
    assert 0 <= number(keys["TrainAccuracy"]) <= 100 and number(keys["ActualFPS"]) > 0
    assert f"Final Train Accuracy : {keys['TrainAccuracy']}" in result.stdout
    config = yaml.safe_load((out / "run" / "config.yaml").read_text())
    assert config["derived"]["world_size"] == 2 and config["derived"]["lr"] == pytest.approx(0.2)


def test_modelzoo_script_needs_data_path(tmp_path):
    result = run_modelzoo("train_full_1p.sh", tmp_path)
    assert result.returncode == 2 and "--data_path=DIR is required" in result.stderr
