"""torchvision's references/classification/train.py as a dialect, and configs/recipes: each recipe is
the command its header names, pasted with --data-path; their commands run as there (per-process
batches, the LR as given); a flag this app does not take is one line."""
import re

import pytest
import torch
import yaml

from conftest import ROOT, train_sh
from mobilenet.cli import build_parser, config_from_args
from mobilenet.config import differing_settings, thaw
from mobilenet.state import lr_factor_fn
from test_dialects import resolved

RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.yaml"))
TINY_IMAGES = ["device=cpu", "model.num_classes=10", "model.resolution=32", "data.train_resolution=32",
               "data.workers=0"]


def source_command(recipe):
    """The train.py flags of the '# Source: torchrun ... train.py FLAGS' lines of a recipe's header."""
    header = re.search(r"^# Source: (.*?)(?=^# Here:)", recipe.read_text(), re.S | re.M)
    if header is None or "torchrun" not in header.group(1):
        return None
    text = " ".join(line.lstrip("# ").split("(")[0] for line in header.group(1).splitlines())
    return text.split("train.py", 1)[1].split()


def parsed(argv, probe=False):
    return config_from_args(build_parser().parse_intermixed_args(argv), probe=probe)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_each_recipe_is_its_source_command(monkeypatch, recipe):
    """Resolved on the 8 processes the recipe assumes, the config file and the command pasted with
    --data-path are one config (the EMA decay that depends on the processes included)."""
    for key, value in {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    flags = source_command(recipe)
    text = recipe.read_text()
    assert re.search(r"\d\d\.\d+ top-1", text) and ("8 cards" in text), "a recipe names its top-1 and its cards"
    if flags is None:  # MobileNetV1's: ModelZoo's recipe (configs/imagenet.yaml), not a torchvision command
        assert recipe.resolve() == (ROOT / "configs" / "imagenet.yaml").resolve()
        return
    theirs = parsed([*flags, "--data-path", "digits", "device=cpu", "model.num_classes=10"])
    ours = parsed(["--config", str(recipe), "--data", "digits", "device=cpu", "model.num_classes=10"])
    assert differing_settings(theirs, ours) == []


def test_the_references_defaults_and_their_meanings(monkeypatch):
    """-b and -j per process under this dialect (main.py's are per node); the LR as given; --amp
    alone is O1; --opt and --lr-scheduler as train.py builds them."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cfg, notes = resolved(["--data-path", "digits", "-b", "16", "-j", "3", "--opt", "sgd_nesterov", "--amp",
                           "--lr-scheduler", "exponentiallr", "--lr-gamma", "0.9", "device=cpu",
                           "model.num_classes=10"])
    assert cfg["data"]["batch_size"] == 16 and cfg["data"]["workers"] == 3 and cfg["model"]["name"] == "resnet18"
    assert cfg["optim"]["nesterov"] is True and cfg["amp"]["level"] == "O1"
    assert cfg["schedule"]["name"] == "step" and cfg["schedule"]["step_epochs"] == 1
    assert cfg["schedule"]["per_epoch"] is True and cfg["optim"]["lr_scale_batch"] == 0
    examples, _ = resolved(["--data", "digits", "-b", "16", "-j", "3", "device=cpu"])
    assert examples["data"]["batch_size"] == 8 and examples["data"]["workers"] == 2  # per node there
    rmsprop, _ = resolved(["--data-path", "digits", "--opt", "rmsprop", "device=cpu", "model.num_classes=10"])
    assert (rmsprop["optim"]["eps"], rmsprop["optim"]["alpha"]) == (0.0316, 0.9)


@pytest.mark.parametrize("argv,fragment", [
    (["--weights", "IMAGENET1K_V1"], "--weights: train.py does not take it; it downloads torchvision's weights"),
    (["--transformer-embedding-decay", "0"], "--transformer-embedding-decay: train.py does not take it"),
    (["--opt", "lamb"], "--opt lamb: torchvision's train.py takes sgd, sgd_nesterov, rmsprop or adamw"),
    (["--lr-scheduler", "onecycle"], "--lr-scheduler onecycle: torchvision's train.py takes steplr"),
    (["--auto-augment", "rand"], "'augment.policy' must be one of augmix|cifar10|imagenet|none|ra|svhn|ta_wide"),
    (["--model", "alexnett"], "--model alexnett: this app trains"),
])
def test_what_this_app_does_not_take_is_one_line_and_exit_2(argv, fragment, capsys):
    import train
    assert train.main(["--data-path", "digits", *argv]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and fragment in error[0], error


def test_flags_that_change_nothing_here_are_said():
    _, notes = resolved(["--data-path", "digits", "--cache-dataset", "--use-v2", "--backend", "pil", "--ra-reps", "2",
                         "device=cpu", "model.num_classes=10"])
    said = "\n".join(notes)
    for fragment in ("--cache-dataset: said and ignored", "--use-v2: said and ignored", "--backend: said and ignored",
                     "--ra-reps 2: ignored without --ra-sampler, as there"):
        assert fragment in said


def test_the_schedules_are_the_references_schedulers_epoch_by_epoch():
    """schedule.per_epoch with a warm-up: torch's LinearLR or ConstantLR then StepLR or
    CosineAnnealingLR in SequentialLR, stepped once an epoch, as train.py builds them."""
    steps, epochs, warmup = 7, 12, 3
    for name, method in (("cosine", "linear"), ("cosine", "constant"), ("step", "constant")):
        schedule = {"name": name, "warmup_epochs": warmup, "warmup_start_factor": 0.01, "warmup_method": method,
                    "per_epoch": True, "min_lr": 0.001, "step_epochs": 1, "gamma": 0.9}
        factor = lr_factor_fn(schedule, steps, epochs, 0.5)
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
        first = (torch.optim.lr_scheduler.LinearLR(optimizer, 0.01, total_iters=warmup) if method == "linear" else
                 torch.optim.lr_scheduler.ConstantLR(optimizer, 0.01, total_iters=warmup))
        main = (torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs - warmup, eta_min=0.001)
                if name == "cosine" else torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.9))
        theirs = torch.optim.lr_scheduler.SequentialLR(optimizer, [first, main], milestones=[warmup])
        for epoch in range(epochs):
            lr = optimizer.param_groups[0]["lr"]
            if name == "cosine" or epoch < warmup:  # their StepLR counts from the warm-up's end (said)
                for step in range(epoch * steps, (epoch + 1) * steps):
                    assert 0.5 * factor(step) == pytest.approx(lr, rel=1e-9), (name, method, epoch)
            optimizer.step()
            theirs.step()


def test_a_pasted_command_runs_on_two_processes_as_there(tmp_path, digits):
    """torchvision-style flags under the launcher: the batch per process, every augmentation on, the
    EMA every 2 steps; the run trains, validates and says what each flag became."""
    out = tmp_path / "run"
    result = train_sh("--nproc", "2", "--model", "mobilenet_v3_small", "-b", "8", "--lr", "0.5", "--lr-scheduler",
                      "cosineannealinglr", "--lr-warmup-epochs", "1", "--lr-warmup-method", "linear", "--auto-augment",
                      "ta_wide", "--epochs", "2", "--random-erase", "0.1", "--weight-decay", "0.00002",
                      "--norm-weight-decay", "0.0", "--label-smoothing", "0.1", "--mixup-alpha", "0.2",
                      "--cutmix-alpha", "1.0", "--model-ema", "--model-ema-steps", "2", "--val-resize-size", "36",
                      "--val-crop-size", "32",
                      "--ra-sampler", "--ra-reps", "4", "--clip-grad-norm", "1", "--data-path", str(digits),
                      "--output-dir", str(out), *TINY_IMAGES, "train.max_steps=4", "train.max_steps_per_epoch=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "batch 8 per process x 2 = 16 global" in result.stdout
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["train"]["ema_steps"] == 2 and config["augment"]["ra_reps"] == 4
    assert config["train"]["ema_decay"] == pytest.approx(1 - (1 - 0.99998) * 2 * 8 * 2 / 2)
    assert "--model-ema = train.ema_decay=" in "\n".join(config["derived"]["command_line"])
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=False)["ema"]["n_averaged"] == 2
    assert thaw(config)["data"]["val_resize_ratio"] == pytest.approx(32 / 36)


def test_clip_grad_norm_bounds_the_update():
    from mobilenet.config import build_config, resolve
    from mobilenet.training import build_train_step

    def update(*settings):
        cfg = resolve(build_config(None, ["device=cpu", "model.width_mult=0.25", "model.num_classes=10",
                                          "optim.momentum=0", "optim.lr=1", "optim.weight_decay=0", *settings]))
        step = build_train_step(cfg, torch.device("cpu"))
        before = torch.cat([p.detach().flatten().clone() for p in step.optimizer_params()])
        step(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.arange(4))
        return (torch.cat([p.detach().flatten() for p in step.optimizer_params()]) - before).norm().item()
    assert update("train.clip_grad_norm=0.001") == pytest.approx(0.001, rel=1e-3)
    assert update() > 0.01


@pytest.mark.parametrize("argv,fragment", [
    (["--val-resize-size", "0"], "--val-resize-size 0 --val-crop-size 224: give two sizes of 1 pixel or more"),
    (["--val-resize-size", "big"], "argument --val-resize-size: invalid int value: 'big'"),
    (["--model-ema", "--model-ema-steps", "0"], "--model-ema-steps 0 --model-ema-decay 0.99998: give at least 1"),
    (["--ra-sampler", "--ra-reps", "0"], "'augment.ra_reps' must be at least 1, got 0"),
])
def test_bad_values_of_its_flags_are_one_line(argv, fragment, capsys):
    import train
    assert train.main(["--data-path", "digits", *argv]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and fragment in error[0], error
