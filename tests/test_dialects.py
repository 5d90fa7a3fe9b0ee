"""The commands users already type: the seed article's, pytorch/examples' main.py flags, Ascend
ModelZoo's main.py flags and its test scripts."""
import datetime
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import ROOT, assert_same_weights, free_port, train_sh
from mobilenet.cli import build_parser, config_from_args
from mobilenet.cli import REFUSED
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
    assert yaml.safe_load((out / "summary.json").read_text())["global_step"] == 3


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
                            "--loss-scale-value", "1024", "--max_steps", "100", "--batch_size", "256",
                            "--lr", "0.1", "--wd", "1e-4", "--print-freq", "10"])
    native, _ = resolved(["--data", "synthetic", "--amp", "O2", "amp.loss_scale=1024",
                          "train.max_steps_per_epoch=102", "data.batch_size=256", "optim.lr=0.1",
                          "optim.lr_scale_batch=0", "optim.weight_decay=1e-4", "train.log_every=10"])
    assert modelzoo == native
    dynamic, notes = resolved(["--apex", "--opt-level", "O1", "--loss-scale-value", "-1",
                               "--stop-step-num", "7"])
    assert dynamic["amp"]["level"] == "O1" and dynamic["amp"]["loss_scale"] == "dynamic"
    assert dynamic["train"]["max_steps"] == 7 and resolved(["--max-steps", "7"])[0]["train"]["max_steps"] == 7
    apex, _ = resolved(["--apex"])  # ModelZoo's default opt level, and main.py's default static scale
    assert apex["amp"]["level"] == "O1" and apex["amp"]["loss_scale"] == 1024
    assert resolved(["--apex", "amp.loss_scale=dynamic"])[0]["amp"]["loss_scale"] == "dynamic"


def rank_environment(monkeypatch, **env):
    """``env`` set, and the variables --distributed writes restored after the test."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "RANK_SIZE", "RANK_ID", "OMP_NUM_THREADS"):
        monkeypatch.setenv(key, "")  # recorded, so that the test's end restores what was there
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))


# Ascend ModelZoo MobileNetV1_ID0094 main.py's flags, row by row
# (read at their commit 6835f66): (their flag as they type it, what it must become here: the settings
# it sets, or the fragment of the one-line refusal where its meaning cannot hold here).
MAIN_PY_FLAGS = [
    (["--data", "/imagenet"], {"data.path": "/imagenet"}),
    (["--arch=mobilenet"], {"model.name": "mobilenet_v1"}),  # theirs, at the recipe's width
    (["-a", "mobilenet"], {"model.name": "mobilenet_v1"}), (["-a", "resnet18"], {"model.name": "resnet18"}),
    (["-j", "6"], {"data.workers": 6}),
    (["--workers=6"], {"data.workers": 6}),
    (["--max_steps=2000"], {"train.max_steps_per_epoch": 2002, "train.max_steps": 0}),
    (["--epochs=3"], {"train.epochs": 3}),
    (["--start-epoch=2"], "resume instead: --resume FILE|auto"),
    (["-b", "64"], {"data.batch_size": 64}),
    (["--batch_size=64"], {"data.batch_size": 64}),
    (["--lr", "0.2"], {"optim.lr": 0.2, "optim.lr_scale_batch": 0}),
    (["--learning-rate=0.2"], {"optim.lr": 0.2, "optim.lr_scale_batch": 0}),
    (["--momentum=0.8"], {"optim.momentum": 0.8}),
    (["--weight-decay=5e-5"], {"optim.weight_decay": 5e-5}),
    (["--wd", "5e-5"], {"optim.weight_decay": 5e-5}),
    (["--print-freq=7"], {"train.log_every": 7}),
    (["-p", "7"], {"train.log_every": 7}),
    (["--seed=3"], {"seed": 3}),
    (["--resume", "x.pt"], {"args.resume": "x.pt"}),  # what train.py hands to run(resume=...)
    (["-e"], {"args.evaluate": True}), (["--evaluate"], {"args.evaluate": True}),  # run(evaluate_only=...);
    # test_distributed's evaluation runs it through train.sh
    (["--pretrained"], "model.pretrained=FILE"),
    (["--prof"], {"train.profile": True, "train.max_steps": 12}),
    (["--apex"], {"amp.level": "O1", "amp.loss_scale": 1024}),
    (["--apex", "--apex-opt-level='O2'".replace("'", "")], {"amp.level": "O2", "amp.loss_scale": 1024}),
    (["--apex", "--loss-scale-value=128"], {"amp.level": "O1", "amp.loss_scale": 128}),
    (["--device_id=0"], {"device_id": 0}),
    (["--distributed"], "set RANK_SIZE"),
    (["--distributed", "--world-size=1", "--dist-rank=0"], "set RANK_SIZE"),
    (["--world-size=2"], "--world-size applies with --distributed only"),
    (["--dist-rank=1"], "--dist-rank applies with --distributed only"),
    (["--dist-url", "tcp://127.0.0.1:23456"], "MASTER_ADDR:MASTER_PORT"),
    (["--dist-backend", "hccl"], "the backend follows the device"),
]


def setting(cfg, dotted):
    for part in dotted.split("."):
        cfg = cfg[part]
    return cfg


@pytest.mark.parametrize("argv,expected", MAIN_PY_FLAGS, ids=[" ".join(a) for a, _ in MAIN_PY_FLAGS])
def test_every_main_py_flag_keeps_its_meaning_or_is_refused(monkeypatch, argv, expected):
    rank_environment(monkeypatch)
    if isinstance(expected, str):
        with pytest.raises(UsageError, match=re.escape(expected)):
            resolved(["device=cpu", *argv])
        return
    cfg, _ = resolved(["device=cpu", *argv])
    args = build_parser().parse_intermixed_args(["device=cpu", *argv])
    assert expected, "a row that checks nothing"
    for key, value in expected.items():
        found = getattr(args, key.removeprefix("args.")) if key.startswith("args.") else setting(cfg, key)
        assert found == value, key


def test_distributed_ranks_as_main_py_numbers_them(monkeypatch):
    rank_environment(monkeypatch, RANK_SIZE=4, RANK_ID=3)
    cfg, notes = resolved(["--dummy", "--distributed", "--world-size=2", "--dist-rank=1", "-b", "256",
                           "-j", "5", "--device_id=0"])
    assert cfg["derived"]["world_size"] == 8 and cfg["data"]["batch_size"] == 64 and cfg["data"]["workers"] == 2
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"]) == ("7", "3")
    assert notes[0] == ("--distributed = rank 7 of 8 (--dist-rank 1 x RANK_SIZE 4 + RANK_ID 3), meeting at "
                        "127.0.0.1:29688")
    assert cfg["device_id"] is None and any("--device_id 0: ignored with --distributed" in n for n in notes)
    rank_environment(monkeypatch, RANK_SIZE=2, RANK_ID=2)
    with pytest.raises(UsageError, match="RANK_ID 2 must lie in 0..RANK_SIZE-1"):
        resolved(["--distributed"])
    rank_environment(monkeypatch, RANK_SIZE=2, RANK_ID=0, MASTER_PORT=29500)  # the environment wins
    assert resolved(["--distributed"])[1][0].endswith("meeting at 127.0.0.1:29500")


def test_no_flag_is_reached_by_a_prefix(tmp_path, refusal):
    for argv in (["--outp", str(tmp_path)], ["--prof"[:-1]], ["--batch", "8"]):
        code, stderr = refusal(*argv)
        assert code == 2 and stderr.strip().count("\n") == 0, stderr
        assert "unrecognized arguments" in stderr or "ambiguous" in stderr
    result = train_sh("--npro", "2")  # the launcher's flags too (train.sh forwards it to train.py)
    assert result.returncode == 2 and "unrecognized arguments: --npro" in result.stderr


def test_their_performance_command_lines_run(tmp_path, digits, monkeypatch, train_here):
    """main.py's two performance lines (their scripts' own), on the demo data, a few steps: 1 card
    with --max_steps (2 + 1 batches here), and the 8-card way with 2 processes this test starts,
    which must train as bash train.sh --nproc 2 does with the same settings."""
    small = ["device=cpu", "model.width_mult=0.25", "model.resolution=32", "model.num_classes=10"]
    one = train_here("--arch=mobilenet", f"--data={digits}", "--batch_size=256", "--learning-rate=0.1",
                     "--epochs=1", "--max_steps=1", "--device_id=0", "--apex", "--apex-opt-level=O2",
                     "--workers=1", "--print-freq=10", *small, "--output", tmp_path / "1p")
    assert one.returncode == 0, one.stderr[-2000:]
    config = yaml.safe_load((tmp_path / "1p" / "config.yaml").read_text())
    assert config["train"]["max_steps_per_epoch"] == 3 and config["amp"]["loss_scale"] == 1024
    assert yaml.safe_load((tmp_path / "1p" / "summary.json").read_text())["global_step"] == 3
    port = str(free_port())
    theirs = ["--arch=mobilenet", f"--data={digits}", "--batch_size=64", "--learning-rate=0.8", "--epochs=1",
              "--apex", "--apex-opt-level=O2", "--workers=2", "--print-freq=10", *small, "train.max_steps=3"]
    ranks = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *theirs, "--distributed", "--world-size=1",
                               "--dist-rank=0", "--output", str(tmp_path / "8p")], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, "RANK_SIZE": "2", "RANK_ID": str(i), "MASTER_PORT": port})
             for i in range(2)]
    for rank in ranks:
        assert rank.wait(timeout=300) == 0, rank.stdout.read()[-2000:]
    ours = train_sh("--nproc", "2", *[a for a in theirs if a != "--workers=2"], "-j", "2",
                    "--output", tmp_path / "nproc")
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert_same_weights(tmp_path / "8p", tmp_path / "nproc")
    config = yaml.safe_load((tmp_path / "8p" / "config.yaml").read_text())
    assert config["derived"]["world_size"] == 2 and config["data"]["batch_size"] == 32


def test_a_distributed_rank_says_whom_it_waits_for_and_a_taken_port_is_one_line(digits):
    with socket.socket() as taken:  # two jobs on their fixed port: the second finds it in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "train.py", "--data", str(digits), "--distributed", "device=cpu"],
                                cwd=ROOT, capture_output=True, text=True, timeout=120,
                                env={**os.environ, "RANK_SIZE": "2", "RANK_ID": "0", "MASTER_PORT": str(port)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"rank 0 of 2: waiting up to 1860 s for the job's 2 processes at 127.0.0.1:{port}" in result.stdout
    assert result.stderr.strip().splitlines() == [f"error: MASTER_PORT {port}: the port is in use at 127.0.0.1:{port} "
                                                  f"(another job, or this job started twice?); give every process "
                                                  f"of this job one free MASTER_PORT"]


def test_a_meeting_that_fails_is_one_line_naming_whom_it_waited_for():
    """The errors torch's own store raises when a process of the job never comes (here with a
    1 s wait, as a job's 1,860 s would end), turned into the line the user reads."""
    from mobilenet.distributed import World, meeting_failure
    world, where = World(rank=0, size=2), f"127.0.0.1:{free_port()}"
    wait = datetime.timedelta(seconds=1)
    with pytest.raises(torch.distributed.DistError) as alone:  # rank 0 while rank 1 never starts
        torch.distributed.TCPStore("127.0.0.1", int(where.split(":")[1]), 2, True, timeout=wait)
    assert str(meeting_failure(alone.value, world, where, 1)) == (
        f"rank 0 waited 1 s at {where}, and 1 of the job's 2 processes arrived; start every one (RANK_ID 0..1 on "
        f"each node) with the same MASTER_ADDR and MASTER_PORT")
    with pytest.raises(torch.distributed.DistError) as lost:  # rank 1 while rank 0 never starts
        torch.distributed.TCPStore("127.0.0.1", int(where.split(":")[1]), 2, False, timeout=wait)
    assert str(meeting_failure(lost.value, World(rank=1, size=2), where, 1)) == (
        f"rank 1 could not reach rank 0 at {where} within 1 s: rank 0 is not running there, or MASTER_ADDR and "
        f"MASTER_PORT differ between the processes")


@pytest.mark.parametrize("argv,fragments", [
    (["-b", "256", "data.batch_size=64"], ["-b/--batch-size 256", "data.batch_size=64", "contradict"]),
    (["--lr", "0.1", "optim.lr_scale_batch=256"], ["--lr 0.1", "optim.lr_scale_batch=256"]),
    (["--dummy", "--data", "/imagenet"], ["--data", "--dummy", "contradict"]),
    (["/imagenet", "--data", "/other"], ["--data", "DIR", "contradict"]),
    (["--no-accel", "--device", "cuda"], ["--device", "--no-accel"]),
    (["--apex", "--amp", "O1", "--apex-opt-level", "O2"], ["--amp", "--apex"]),
    (["/a", "/b"], ["one data folder"]),
    (["-a", "lenet5"], ["-a/--arch lenet5", "this app trains mobilenet_v1, mobilenet_v2, resnet18 and torchvision"]),
    (["--pretrained"], ["--pretrained", "model.pretrained=FILE"]),
    (["--apex-opt-level", "O2"], ["--apex-opt-level", "--apex"]),
    (["--loss-scale-value", "128"], ["--loss-scale-value", "--apex"]),
    (["--momentum", "1.5"], ["--momentum 1.5", "optim.momentum"]),
    (["--stop-step-num", "0"], ["--max-steps/--stop-step-num 0", "at least 1"]),
    (["--max_steps", "-1"], ["--max_steps -1", "N+2 batches"]),
    (["--batch-siz", "8"], ["unrecognized arguments: --batch-siz"]),
    (["--momentum", "x"], ["--momentum", "invalid float value"]),
])
def test_dialect_mistakes_are_one_line_errors(tmp_path, refusal, argv, fragments):
    code, stderr = refusal(*argv, "--output", tmp_path)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert all(fragment in lines[0] for fragment in fragments), lines[0]


def test_agreeing_flag_and_setting_are_accepted():
    cfg, _ = resolved(["-b", "64", "data.batch_size=64", "/imagenet", "data.path=/imagenet"])
    assert cfg["data"]["batch_size"] == 64 and cfg["data"]["path"] == "/imagenet"


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_each_refused_launcher_flag_names_what_to_run(tmp_path, refusal, flag):
    nargs = REFUSED[flag][0]
    code, stderr = refusal(flag, *["1"] * nargs, "--output", tmp_path)
    assert code == 2
    lines = stderr.strip().splitlines()
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
    case = "MobileNetV1_ID0094_for_PyTorch_bs256_1p_perf"  # their Network, so their dashboards' names
    keys = key_lines(out / f"{case}.log")
    assert keys["Network"] == "MobileNetV1_ID0094_for_PyTorch" and keys["CaseName"] == case and keys["DeviceType"]
    summary = yaml.safe_load((out / "run" / "summary.json").read_text())
    assert number(keys["CompileTime"]) == pytest.approx(summary["first_step_s"], abs=1e-3)
    assert summary["first_step_s"] > 0
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
    assert config["train"]["max_steps_per_epoch"] == 2002 and config["train"]["max_steps"] == 0  # --max_steps=2000
    assert config["train"]["epochs"] == 1 and config["optim"]["lr"] == 0.1
    assert "--device_id=97" not in config["derived"]["command_line"]  # train.sh took it: one process on card 97
    assert "img/s" in (out / "train_97.log").read_text()


def test_modelzoo_8p_full_script_on_two_listed_cards(tmp_path, modelzoo_output):
    result = run_modelzoo("train_full_8p.sh", tmp_path, "--data_path=synthetic", "--device_list=0,1",
                          "data.synthetic_size=512", "model.width_mult=0.25", "model.resolution=64",
                          "data.workers=1", "--epochs=1")
    assert result.returncode == 0, result.stdout + result.stderr
    out = modelzoo_output
    keys = key_lines(out / "MobileNetV1_ID0094_for_PyTorch_bs512_2p_acc.log")
    assert "CompileTime" not in keys  # their 8-card script writes none
    assert number(keys["RankSize"]) == 2 and number(keys["BatchSize"]) == 512
    assert 0 <= number(keys["TrainAccuracy"]) <= 100 and number(keys["ActualFPS"]) > 0
    assert f"Final Train Accuracy : {keys['TrainAccuracy']}" in result.stdout
    config = yaml.safe_load((out / "run" / "config.yaml").read_text())
    assert config["derived"]["world_size"] == 2 and config["derived"]["lr"] == pytest.approx(0.2)


def test_modelzoo_script_needs_data_path(tmp_path):
    result = run_modelzoo("train_full_1p.sh", tmp_path)
    assert result.returncode == 2 and "--data_path=DIR is required" in result.stderr


def launcher_flags(script):
    """The flags a shell script's argument loop takes (its `case` patterns: --name and --name=*)."""
    return set(re.findall(r"(?:^\s*|\|)(--[\w-]+)(?:=\*)?(?=[|)])", script.read_text(), re.M))


def test_train_py_and_the_launchers_agree_on_the_launcher_flags():
    """train.sh's launcher flags (the one place that maps them) and train.py: each card or address
    flag train.sh maps, train.py takes with the same meaning (one card, --device_id) or refuses
    naming train.sh; what train.py refuses as a launcher flag, train.sh maps; the ModelZoo scripts'
    card-list flags are train.sh's."""
    ours = launcher_flags(ROOT / "train.sh")
    assert {"--nproc", "--nnodes", "--addr", "--device-list", "--device_list", "--device_id", "--gpu"} <= ours
    parser = build_parser("train.py")
    takes = {option for action in parser._actions for option in action.option_strings}
    for flag in ours - {"--nproc", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--max-restarts",
                        "--rdzv-id", "--join-timeout", "--last-call"}:
        assert flag in takes, flag  # a flag of their main.py: train.py takes or refuses it
        if flag in REFUSED:
            assert "train.sh" in REFUSED[flag][1], flag
    assert {flag for flag, (_, why) in REFUSED.items() if "give it to the launcher" in why} <= ours
    modelzoo = launcher_flags(ROOT / "scripts" / "modelzoo" / "common.sh")
    assert {"--device_list", "--device-list", "--nproc"} <= modelzoo and modelzoo - {
        "--data_path", "--batch_size", "--learning_rate", "--device_id"} <= ours


def test_the_modelzoo_scripts_pass_the_recipe_of_configs_imagenet():
    """scripts/modelzoo/common.sh gives main.py's flags (a shell script cannot read the YAML): their
    values are configs/imagenet.yaml's."""
    recipe = yaml.safe_load((ROOT / "configs" / "imagenet.yaml").read_text())
    script = (ROOT / "scripts" / "modelzoo" / "common.sh").read_text()
    per_card = re.search(r"batch_size:-\$\(\( (\d+) \* RankSize", script).group(1)
    lr = re.search(r'print ([\d.]+) \* \$RankSize', script).group(1)
    assert int(per_card) == recipe["data"]["batch_size"] == recipe["optim"]["lr_scale_batch"]
    assert float(lr) == recipe["optim"]["lr"]
    assert f"--apex-opt-level={recipe['amp']['level']}" in script
    assert f"--loss-scale-value={recipe['amp']['loss_scale']}" in script
