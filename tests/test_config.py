import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import train
from conftest import ROOT, TINY, run_train
from mobilenet.config import DEFAULTS, build_config, resolve, thaw
from mobilenet.distributed import World
from mobilenet.errors import UsageError


def test_defaults_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.4\nmodel:\n  width_mult: 0.5\n")
    cfg = build_config(path, ["optim.lr=1", "amp.loss_scale=1024", "data.path=/x",
                              "optim.weight_decay=4e-5"])
    assert cfg["optim"]["weight_decay"] == 4e-5
    assert cfg["optim"]["lr"] == 1.0 and isinstance(cfg["optim"]["lr"], float)
    assert cfg["model"]["width_mult"] == 0.5
    assert cfg["amp"]["loss_scale"] == 1024 and cfg["data"]["path"] == "/x"
    assert cfg["train"]["epochs"] == DEFAULTS["train"]["epochs"]


@pytest.mark.parametrize("override,message", [
    ("optim.lrr=0.1", "unknown setting 'optim.lrr'"),
    ("optim=1", "unknown setting 'optim'"),
    ("train.epochs=ten", "'train.epochs' must be an integer"),
    ("optim.impl=turbo", "'optim.impl' must be one of fused|standard"),
    ("model.width_mult=0", "'model.width_mult' must be positive"),
    ("amp.loss_scale=-2", "'amp.loss_scale' must be 'dynamic' or a positive number"),
    ("train.freeze_bn=3", "'train.freeze_bn' must be true or false"),
    ("model.channels_last=yes please", "'model.channels_last' must be auto, true or false"),
    ("epochs", "expected key.sub=value"),
])
def test_bad_overrides_are_usage_errors(override, message):
    with pytest.raises(UsageError, match=message.replace("|", r"\|")):
        build_config(None, [override])


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("schedule:\n  nmae: cosine\n")
    with pytest.raises(UsageError, match=r"--config .*bad.yaml: unknown setting 'schedule.nmae'"):
        build_config(path)


def assert_one_line_error(result, *fragments):
    """``result``: a CompletedProcess, or the refusal fixture's (exit code, stderr)."""
    code, stderr = (result.returncode, result.stderr) if hasattr(result, "returncode") else result
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_cli_rejects_unknown_key_and_bad_value(tmp_path, refusal):
    assert_one_line_error(run_train("--output", tmp_path, "train.epochz=1"), "train.epochz")  # a real process's
    assert_one_line_error(refusal("--output", tmp_path, "optim.lr=fast"), "optim.lr")
    assert_one_line_error(refusal("--config", tmp_path / "none.yaml"), "none.yaml")


def test_cli_rejects_missing_data_folder(tmp_path, refusal):
    missing = tmp_path / "imagenet"
    assert_one_line_error(refusal("--data", missing, "--output", tmp_path / "run", *TINY), str(missing), "train")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_cli_rejects_class_count_mismatch(tmp_path, digits, refusal):
    assert_one_line_error(refusal("--data", digits, "--output", tmp_path, *TINY, "model.num_classes=1000",
                                  "--config", "configs/demo.yaml"), "10 classes", "model.num_classes=1000")


def test_resolve_computes_derived_values_once_into_a_read_only_config():
    cfg = build_config(ROOT / "configs" / "imagenet.yaml", ["data.batch_size=64", "optim.foreach=true"],
                       settings={"optim.impl": "standard", "data.path": "synthetic", "device": "cpu"})
    resolved = resolve(cfg, name="imagenet", world=World(size=4))
    derived = resolved["derived"]
    assert derived["global_batch"] == 256 and derived["lr"] == pytest.approx(0.1)  # 0.1 per 256
    assert derived["device"] == "cpu" and derived["channels_last"] is True
    assert derived["optimizer_implementation"] == "foreach" and derived["amp_backend"] == "native"
    assert resolved["output"] == "runs/imagenet-standard" and cfg["output"] is None
    for change in (lambda: resolved.__setitem__("seed", 1), lambda: resolved["optim"].update(lr=1),
                   lambda: resolved["derived"].pop("lr")):
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert resolve(cfg, world=World(size=1))["derived"]["lr"] == pytest.approx(0.025)


@pytest.mark.parametrize("impl,foreach,expected", [
    ("standard", "auto", "loop"),      # what torch.optim.SGD(params, lr, ...) runs on cpu
    ("standard", True, "foreach"), ("standard", False, "loop"), ("fused", "auto", "torch_fused")])
def test_standard_is_torchs_own_choice_unless_forced(impl, foreach, expected):
    cfg = build_config(None, settings={"optim.impl": impl, "optim.foreach": foreach, "device": "cpu"})
    assert resolve(cfg)["derived"]["optimizer_implementation"] == expected


def test_device_auto_is_the_accelerator_this_machine_has():
    expected = "cuda" if torch.cuda.is_available() else "cpu"  # torch_npu cannot import here
    assert resolve(build_config(None))["derived"]["device"] == expected


@pytest.mark.parametrize("settings,message", [
    ({"optim.impl": "fused", "optim.foreach": False}, "leave it at auto with optim.impl=fused"),
    ({"amp.level": "O2", "train.ema_decay": 0.99}, "train.ema_decay"),
    ({"amp.level": "O1", "amp.backend": "apex"}, "amp.backend=apex"),
    ({"device": "cuda"} if not torch.cuda.is_available() else {"device": "npu"}, "--device"),
])
def test_resolve_rejects_what_cannot_run_here(settings, message):
    with pytest.raises(UsageError, match=message):
        resolve(build_config(None, settings=settings))


def test_run_takes_only_a_resolved_config():
    from mobilenet.engine import run
    with pytest.raises(TypeError, match="resolve"):
        run(build_config(ROOT / "configs" / "demo.yaml"))


def test_build_config_resolve_and_run_without_train_py(tmp_path, digits):
    """The library path a fork uses, in a fresh interpreter outside the checkout."""
    out = tmp_path / "run"
    code = ("from mobilenet.config import build_config, resolve\n"
            "from mobilenet.engine import run\n"
            f"cfg = build_config({str(ROOT / 'configs' / 'demo.yaml')!r}, {TINY!r} + "
            "['train.max_steps_per_epoch=6', 'train.epochs=1'], "
            f"settings={{'data.path': {str(digits)!r}, 'output': {str(out)!r}}})\n"
            "print(run(resolve(cfg))['optimizer_implementation'])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "optimizer SGD (per-parameter loop, foreach=False)" in result.stdout.splitlines()[0]
    assert result.stdout.splitlines()[-1] == "loop"
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["derived"]["optimizer_implementation"] == "loop" and saved["output"] == str(out)


def test_a_runs_config_yaml_is_a_recipe_again(tmp_path):
    cfg = resolve(build_config(ROOT / "configs" / "imagenet.yaml", ["data.path=synthetic"]), name="x")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(thaw(cfg)))
    again = resolve(build_config(path), name="y")
    assert again == cfg and again["derived"]["lr"] == pytest.approx(0.1)


@pytest.mark.parametrize("override,message", [
    ("data.workers=-1", "'data.workers' must be at least 0, got -1"),
    ("schedule.step_epochs=0", "'schedule.step_epochs' must be at least 1, got 0"),
    ("optim.momentum=-1", "'optim.momentum' must be in [0, 1)"),
    ("optim.momentum=1", "'optim.momentum' must be in [0, 1)"),
    ("optim.betas=[0.9,1.5]", "'optim.betas' must be in [0, 1)"),
    ("train.ema_decay=1", "'train.ema_decay' must be in [0, 1)"),
    ("data.min_scale=0", "'data.min_scale' must be in (0, 1]"),
    ("schedule.gamma=2", "'schedule.gamma' must be in (0, 1]"),
    ("train.label_smoothing=1", "'train.label_smoothing' must be in [0, 1)"),
    ("train.checkpoint_every_minutes=-5", "'train.checkpoint_every_minutes' must be at least 0"),
    ("seed=-1", "'seed' must be at least 0"),
    ("optim.eps=0", "'optim.eps' must be positive"),
])
def test_every_setting_range_is_checked_in_one_line(override, message, capsys):
    import train
    assert train.main(["--data", "synthetic", override]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0], error


def test_every_numeric_setting_has_a_range():
    from mobilenet.config import RANGES, flatten
    numeric = {key for key, value in flatten(DEFAULTS)
               if isinstance(value, (int, float, list)) and not isinstance(value, bool)}
    assert numeric - set(RANGES) == set()


@pytest.mark.parametrize("settings,message", [
    ({"optim.nesterov": True, "optim.momentum": 0.0}, "optim.name=sgd with optim.momentum=0.0, optim.nesterov=True: "
     "SGD refuses them together (Nesterov momentum requires a momentum and zero dampening); change one of them"),
    ({"schedule.min_lr": 1.0}, "schedule.min_lr=1 is above the learning rate 0.1"),
])
def test_settings_that_contradict_each_other(settings, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve(build_config(None, settings=settings))


@pytest.mark.parametrize("flags,message", [
    (["--nproc", "0"], "--nproc must be at least 1 (processes on this node, one per card), got 0"),
    (["--nproc=two"], "--nproc needs a whole number, got 'two'"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be below --nnodes (2), got 2"),
    (["--master-port", "70000"], "--master-port must be in 1..65535, got 70000"),
    (["--max-restarts", "-1"], "--max-restarts needs a whole number, got '-1'"),
    (["--nproc"], "--nproc needs a value"),
])
def test_launcher_flags_are_checked(flags, message):
    result = subprocess.run(["bash", "train.sh", *flags], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {message}", result.stderr


@pytest.mark.parametrize("override,message", [
    ("optim.lr=", "'optim.lr' needs a value"), ("data.batch_size=null", "'data.batch_size' needs a value"),
    ("train.epochs=~", "'train.epochs' needs a value"),
    ("amp.loss_scale=inf", "'amp.loss_scale' must be 'dynamic' or a positive number"),
    ("amp.loss_scale=nan", "'amp.loss_scale' must be 'dynamic' or a positive number"),
    ("optim.lr=inf", "'optim.lr' must be a finite number"), ("optim.betas=[0.9, .nan]", "a finite number"),
    ("seed=18446744073709551616", "'seed' must be at least 0 and at most 4294967295"),
])
def test_empty_null_and_non_finite_values_are_usage_errors(override, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        build_config(None, [override])


def test_yaml_errors_name_the_line_and_column(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("optim:\n  lr: 0.1\n  momentum: [0.9\n")
    with pytest.raises(UsageError, match=r"broken.yaml: invalid YAML at line 4, column 1 \(") as error:
        build_config(path)
    assert "\n" not in str(error.value)


NO_WORKERS = [setting for setting in TINY if not setting.startswith("data.workers")]


def test_workers_auto_shares_the_usable_cores_among_the_node_processes(tmp_path, digits):
    from mobilenet.device import usable_cores
    from mobilenet.data.sources import auto_workers
    folder, synthetic = {"path": "/imagenet", "cache_mb": 0}, {"path": "synthetic", "cache_mb": 0}
    assert [auto_workers(folder, processes, cores=16) for processes in (1, 2, 8, 16, 32)] == [15, 7, 1, 0, 0]
    assert auto_workers(synthetic, 1, cores=64) == 4  # random images are only collated
    # the whole set decoded in memory: a worker's hand-over costs more than the crop it takes over
    assert auto_workers({"path": str(digits), "cache_mb": 64}, 1, cores=16) == 0
    assert auto_workers({"path": str(digits), "cache_mb": 1}, 1, cores=16) == 15  # 1 MiB holds a part
    resolved = resolve(build_config(None, ["device=cpu", f"data.path={digits}"]))
    assert resolved["data"]["workers"] == "auto" and resolved["derived"]["workers"] == max(0, usable_cores() - 1)
    for given in (["data.workers=3"], ["-j", "3"], ["--workers", "3"]):  # an explicit value wins
        out = tmp_path / given[0]
        assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out), *given,
                           *NO_WORKERS, "--epochs", "1", "train.max_steps=2"]) == 0
        assert yaml.safe_load((out / "config.yaml").read_text())["derived"]["workers"] == 3
    out = tmp_path / "auto"
    assert train.main(["--config", "configs/demo.yaml", "--data", str(digits), "--output", str(out), *NO_WORKERS,
                       "--epochs", "1", "train.max_steps=2"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["data"]["workers"] == "auto" and saved["derived"]["workers"] == 0  # the demo: in memory


def cgroup_with_quota(cpus):
    """A cgroup of its own whose CPU quota is ``cpus`` (v1's cpu controller, or v2's), made here;
    its cgroup.procs file (write a pid to move a process in), or None where this machine lets no
    process make one."""
    name = f"mobilenet-test-{os.getpid()}"
    for folder, limit in ((Path("/sys/fs/cgroup/cpu") / name, {"cpu.cfs_quota_us": f"{int(cpus * 100000)}"}),
                          (Path("/sys/fs/cgroup") / name, {"cpu.max": f"{int(cpus * 100000)} 100000"})):
        try:
            folder.mkdir(exist_ok=True)
            for file, value in limit.items():
                (folder / file).write_text(value)
            return folder / "cgroup.procs"
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def test_workers_auto_sees_a_cpu_quota(tmp_path):
    """A container limited to 1 CPU (docker --cpus 1) on a host of more cores: one core is usable,
    so no loader worker (the process itself feeds the device)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a quota of one changes nothing here")
    procs = cgroup_with_quota(1)
    if procs is None:
        pytest.skip("this machine lets no process make a cgroup with a CPU quota")
    try:
        script = ("from mobilenet.config import build_config, resolve; "
                  "print(resolve(build_config(None, ['device=cpu', 'data.path=/imagenet']))['derived']['workers'])")
        result = subprocess.run(["sh", "-c", f'echo $$ > {procs} && exec "$0" -c "$1"', sys.executable, script],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split() == ["0"]
    finally:
        procs.parent.rmdir()


def test_decode_auto_takes_the_workers_off_cuda_and_says_why():
    from mobilenet.data.sources import choose_decode
    cfg = resolve(build_config(None, ["device=cpu", "data.path=/imagenet"]))
    assert (cfg["data"]["decode"], cfg["derived"]["decode"]) == ("auto", "workers")
    assert cfg["derived"]["decode_why"] == "workers (auto: decoding on the device is for cuda; this is cpu)"
    assert choose_decode("device", "cpu", workers=3) == ("device", "device (data.decode=device)")
    assert choose_decode("auto", "cuda", workers=3, probe=False)[0] == "workers"  # the launcher's check


def test_compile_auto_compiles_where_it_pays_and_says_why():
    from mobilenet.device import COMPILE_MAX_SHARE, COMPILE_SECONDS, EAGER_HOST_STEP_S, choose_compile

    def choose(setting, device, seconds, **given):  # a run of ``seconds`` at the host's floor per step
        return choose_compile(setting, device, steps=lambda limit: min(limit, int(seconds / EAGER_HOST_STEP_S)),
                              batch=1, cost=lambda: 1.0, **given)
    long_run = COMPILE_SECONDS / COMPILE_MAX_SHARE
    assert choose("auto", "cuda", long_run)[0] == {"backend": "inductor", "mode": "reduce-overhead"}
    assert choose("auto", "cuda", long_run / 2)[0] is None and "off (auto: compiling" in choose(
        "auto", "cuda", long_run / 2)[1]
    assert choose("auto", "cuda", 1e9, eager_only="apex")[0] is None
    for device in ("cpu", "npu"):
        assert choose("auto", device, 1e9)[0] is None
    assert choose(True, "cpu", 0)[0] == {"backend": "inductor", "mode": None}
    assert choose(False, "cuda", 1e9)[0] is None
    derived = resolve(build_config(None, ["device=cpu"]))["derived"]  # the default: auto
    assert derived["compile"] is None and derived["compile_why"].startswith("off (auto: on cpu")
    derived = resolve(build_config(None, ["device=cpu", "train.measure_breakdown=true"]))["derived"]
    assert derived["compile"] is None
    with pytest.raises(UsageError, match="train.compile=true: train.measure_breakdown"):
        resolve(build_config(None, ["device=cpu", "train.compile=true", "train.measure_breakdown=true"]))


def test_compile_auto_estimates_the_run_from_its_steps_and_its_models_cost(tmp_path):
    from mobilenet.config import steps_counted_up_to
    from mobilenet.data.sources import train_images
    from mobilenet.model import relative_cost
    for c in range(3):
        (tmp_path / "train" / str(c)).mkdir(parents=True)
        for i in range(5):
            (tmp_path / "train" / str(c) / f"{i}.jpg").write_bytes(b"")
    assert train_images({"path": str(tmp_path)}, limit=100) == 15
    assert train_images({"path": str(tmp_path)}, limit=4) == 4
    imagenet = build_config(ROOT / "configs" / "imagenet.yaml", ["data.path=synthetic", "data.synthetic_size=1281167"])
    assert steps_counted_up_to(imagenet, 256)(10**9) == 90 * (1281167 // 256)
    folder = build_config(None, [f"data.path={tmp_path}", "data.batch_size=2", "train.epochs=3"])
    assert steps_counted_up_to(folder, 2)(100) == 3 * 7
    assert steps_counted_up_to(folder, 2)(4) == 3 * 4  # an epoch that holds them: counted no further
    capped = build_config(ROOT / "configs" / "imagenet.yaml", ["data.path=synthetic", "train.max_steps=2000",
                                                                 "data.synthetic_size=1281167"])
    assert steps_counted_up_to(capped, 256)(10**9) == 2000
    # "how expensive" asks the model table: multiply-adds against MobileNetV1 at width 1.0 / 224 px
    assert relative_cost({"name": "mobilenet_v1", "width_mult": 1.0, "resolution": 224}) == 1
    assert 0.05 < relative_cost({"name": "mobilenet_v1", "width_mult": 0.25, "resolution": 224}) < 0.1
    assert relative_cost({"name": "resnet18", "width_mult": 0.25, "resolution": 224}) > 3  # no width: ignored


def test_a_setting_the_chosen_row_does_not_take_is_said_the_same_way_for_every_table():
    from mobilenet.config import build_config, resolve
    cfg = resolve(build_config(ROOT / "configs" / "imagenet.yaml", [
        "device=cpu", "optim.betas=[0.5, 0.5]", "model.name=resnet18", "model.width_mult=0.5", "data.path=synthetic",
        "data.hflip=false"]))
    assert list(cfg["derived"]["not_taken"]) == [
        "optim.betas=[0.5, 0.5]: sgd does not take it (it takes optim.momentum, optim.nesterov); ignored",
        "model.width_mult=0.5: resnet18 does not take it (it takes none of model.width_mult); ignored",
        "data.hflip=False: synthetic does not take it (it takes data.synthetic_size); ignored"]


def test_a_forkers_row_whose_class_refuses_its_settings_together_is_one_line():
    """SGD's row with dampening (a forker's): nesterov with dampening is SGD's own refusal, one line."""
    as_a_forker = ("import sys, torch\nfrom mobilenet import optim\n"
                   "optim.ALGORITHMS['sgd'] = optim.Algorithm(torch.optim.SGD, {'momentum': optim.MOMENTUM, "
                   "'nesterov': optim.Setting(False), 'dampening': optim.Setting(0.0, '[0, 1)')})\n"
                   "import train\nsys.exit(train.main(['--data', 'synthetic', 'device=cpu', 'optim.nesterov=true', "
                   "'optim.dampening=0.5']))\n")
    ran = subprocess.run([sys.executable, "-c", as_a_forker], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2 and ran.stderr.strip().splitlines() == [
        "error: optim.name=sgd with optim.momentum=0.9, optim.nesterov=True, optim.dampening=0.5: SGD refuses them "
        "together (Nesterov momentum requires a momentum and zero dampening); change one of them"], ran.stderr


def test_an_algorithm_row_alone_brings_its_own_setting(tmp_path, digits):
    """A forker's row with a setting of its own (Adagrad's lr_decay): config takes its default and
    range from the row, config.yaml records it, a bad value is one line; nothing else is edited."""
    args = ["--config", "configs/demo.yaml", "--data", str(digits), *NO_WORKERS, "device=cpu", "optim.name=adagrad",
            "train.max_steps=2", "--epochs", "1"]
    as_a_forker = ("import sys, torch\nfrom mobilenet import optim\n"
                   "optim.ALGORITHMS['adagrad'] = optim.Algorithm(torch.optim.Adagrad, "
                   "{'lr_decay': optim.Setting(0.0, '[0, inf)')}, kernels=('foreach',))\n"
                   "import train\nargs = sys.argv[1:]\n"
                   f"good = train.main([*args, 'optim.lr_decay=0.01', '--output', {str(tmp_path / 'run')!r}])\n"
                   f"bad = train.main([*args, 'optim.lr_decay=-1', '--output', {str(tmp_path / 'bad')!r}])\n"
                   "sys.exit(10 * good + bad)\n")
    ran = subprocess.run([sys.executable, "-c", as_a_forker, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 2, ran.stderr[-2000:]  # the good run 0, the bad one 2
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["optim"]["lr_decay"] == 0.01
    assert ran.stderr.strip().splitlines()[-1] == ("error: override 'optim.lr_decay=-1': 'optim.lr_decay' must be at "
                                                   "least 0, got -1.0"), ran.stderr
