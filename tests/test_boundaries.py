"""Every setting of the schema through its boundary and odd values: the ends of its range, just
outside them, empty, null, NaN, inf, the wrong type, and a huge value where that cannot fill the
memory or fork without bound. Each value either resolves and trains a step of the tiny model or
is one UsageError line (exit 2 at the command line). In one process, through the same
``key=value`` parsing, resolve() and engine.run() the command line uses."""
import math
import shutil

import pytest

from mobilenet.config import (AUTO_OR_BOOL, AUTO_OR_INT, CHOICES, DEFAULTS, RANGES, build_config, flatten,
                              in_range, resolve)
from mobilenet.engine import run
from mobilenet.errors import UsageError
from mobilenet.model import MODELS

# A run of one step of the smallest model on 16 synthetic images (the data settings: on the demo's
# JPEG files, where they apply).
TINY_RUN = {"data.path": "synthetic", "data.synthetic_size": 16, "data.batch_size": 4,
            "data.val_batch_size": 4, "data.workers": 0, "model.width_mult": 0.25, "model.resolution": 32,
            "model.num_classes": 4, "train.epochs": 1, "train.max_steps": 1, "train.log_every": 1}
# A huge value would allocate it (memory) or start that many processes.
NO_HUGE = {"model.width_mult", "model.num_classes", "model.resolution", "data.batch_size",
           "data.val_batch_size", "data.workers", "data.synthetic_size", "data.train_resolution"}
ODD = ["", "null", "~", ".nan", ".inf", "-.inf", "[1]", "{a: 1}", "x", "true"]
VALID, INVALID, EITHER = "trains", "refused", "either"
# Valid values this machine cannot run, refused in one line all the same (no such device here,
# no apex installed): what such a line must say.
CANNOT_RUN_HERE = ("no npu", "no cuda", "not available", "apex", "torch_npu", "CUDA")
# Values inside their range that a rule across settings refuses in this tiny run, and what its
# line must say (each rule has its own test).
CROSS_SETTING = {("data.batch_size", "1"): "the last BatchNorm would normalise one value",
                 ("schedule.min_lr", str(10 ** 12)): "above the learning rate",
                 ("train.stall_timeout", "1e-06"): "give 0 (no watchdog) or at least 1 second"}


def number_values(key, default):
    """(value, expected): the range's ends, the values just inside and just outside them, and a
    huge one."""
    interval = RANGES.get(key, "(-inf, inf)")
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    step = 1 if isinstance(default, int) and not isinstance(default, bool) else 1e-6
    values = []
    for bound, inside in ((low, step), (high, -step)):
        if math.isfinite(bound):
            values += [bound, bound + inside, bound - inside]
    if key not in NO_HUGE:
        values.append(10 ** 12)
    values = [int(v) if step == 1 else v for v in values]
    return [(v, VALID if in_range(v, interval) else INVALID) for v in values]


def odd(valid=()):
    return [(v, VALID if v in valid else INVALID) for v in ODD]


def values_of(key, default):
    """Every value to try for ``key``, with what it must do."""
    if key in CHOICES:
        return [(v, VALID) for v in sorted(CHOICES[key])] + [("bogus", INVALID)] + odd()
    if key == "model.name":  # the table's, or torchvision's by name
        return [(v, VALID) for v in sorted(MODELS)] + [("bogus", INVALID)] + odd()
    if isinstance(default, bool):
        return [("true", VALID), ("false", VALID), ("1", EITHER)] + odd(valid={"true"})
    if isinstance(default, list):
        ends = number_values(key, default[0])
        return ([(f"[{v}, {v}]", expected) for v, expected in ends]
                + [("[0.5]", INVALID), ("[0.5, 0.5, 0.5]", INVALID)] + odd())
    if isinstance(default, (int, float)):
        return number_values(key, default) + odd()
    if key == "amp.loss_scale":
        return [("dynamic", VALID), (1, VALID), (65536, VALID), (0, INVALID), (-1, EITHER),
                ("static", INVALID)] + odd()
    if key in AUTO_OR_BOOL:
        return [("auto", VALID), ("true", VALID), ("false", VALID)] + odd(valid={"true"})
    if key in ("data.global_batch", "train.grad_accum_steps"):  # an image count the processes may not fill
        return [("auto", VALID)] + [(v, EITHER if expected == VALID else expected)
                                    for v, expected in number_values(key, 1)] + odd()
    if key in AUTO_OR_INT:
        return [("auto", VALID)] + number_values(key, 0) + odd()
    # paths (data, output, pretrained): what each value means depends on the key
    return [(v, EITHER) for v in ODD + ["synthetic", "digits", "1", "no/such/file"]]


CASES = [(key, value, expected) for key, default in flatten(DEFAULTS) for value, expected in values_of(key, default)]


def test_the_cases_cover_every_setting():
    assert {key for key, _, _ in CASES} == {key for key, _ in flatten(DEFAULTS)}
    assert len(CASES) > 400 and {expected for _, _, expected in CASES} == {VALID, INVALID, EITHER}


def try_setting(key, value, folder, digits):
    """What ``key=value`` did: 'trained', 'compiles' (not run: test_compile.py trains it),
    'refused: LINE', or 'broken: WHAT' (a multi-line refusal or any other exception)."""
    settings = {**TINY_RUN}
    if key.startswith("data."):
        settings.update({"data.path": digits, "model.num_classes": 10})
    settings.pop(key, None)
    overrides = [f"{k}={v}" for k, v in settings.items()] + [f"{key}={value}"]
    if key != "output":
        overrides.append(f"output={folder}")
    try:
        cfg = resolve(build_config(None, overrides))
        if cfg["derived"]["compile"]:  # compiling takes half a minute
            return "compiles"
        summary = run(cfg, start_over=True)
    except UsageError as e:
        text = str(e).strip()
        if text and "\n" not in text:
            return f"refused: {text}"
        return f"broken: a UsageError of {len(text.splitlines())} lines"
    except Exception as e:  # noqa: BLE001 - what this test looks for
        return f"broken: {type(e).__name__}: {str(e)[:200]}"
    return "trained" if summary.get("global_step", 0) >= 1 else f"broken: trained no step ({summary})"


def problem(key, value, expected, outcome):
    """What is wrong with ``outcome`` for a case that must do ``expected``, or None."""
    if outcome.startswith("broken"):
        return outcome
    if (key, str(value)) in CROSS_SETTING:
        return None if CROSS_SETTING[key, str(value)] in outcome else f"not the cross-setting refusal: {outcome}"
    if expected == VALID and outcome.startswith("refused") and not any(
            reason in outcome for reason in CANNOT_RUN_HERE):
        return f"a valid value was refused: {outcome}"
    if expected == INVALID and not outcome.startswith("refused"):
        return f"an invalid value was taken ({outcome})"
    return None


@pytest.fixture(scope="module")
def few_digits(digits, tmp_path_factory):
    """The demo's JPEG files, 8 train and 2 val images a class: real decoding, little of it."""
    root = tmp_path_factory.mktemp("few") / "digits"
    for subset, count in (("train", 8), ("val", 2)):
        for folder in sorted((digits / subset).iterdir()):
            (root / subset / folder.name).mkdir(parents=True)
            for image in sorted(folder.iterdir())[:count]:
                shutil.copy(image, root / subset / folder.name / image.name)
    return root


def test_every_setting_at_its_boundaries_trains_or_is_one_line(tmp_path, monkeypatch, few_digits):
    """Valid values resolve and train a step (or are refused only because this machine cannot run
    them), invalid ones are one line, and every setting trains with at least one value; each
    failure names its case."""
    monkeypatch.chdir(tmp_path)  # output= and relative paths land here
    outcomes = {(key, str(value)): try_setting(key, value, tmp_path / f"case{index}", few_digits)
                for index, (key, value, _) in enumerate(CASES)}
    failures = [f"{key}={value} (must be {expected}): {wrong}" for key, value, expected in CASES
                if (wrong := problem(key, value, expected, outcomes[key, str(value)]))]
    untrained = sorted({key for key, _, _ in CASES} - {key for (key, _), outcome in outcomes.items()
                                                       if outcome in ("trained", "compiles")})
    failures += [f"{key}: no value of it trained" for key in untrained]
    assert not failures, f"{len(failures)} of {len(CASES)} cases:\n" + "\n".join(failures)


@pytest.mark.parametrize("resolution, freeze_bn, trains", [(32, "false", False), (33, "false", True),
                                                           (64, "false", True), (32, "true", True)])
def test_a_batch_of_one_trains_where_batchnorm_sees_more_than_one_value(tmp_path, resolution, freeze_bn,
                                                                        trains):
    """BatchNorm needs two values per channel: batch 1 trains where the last feature map is larger
    than 1x1 (above 32 px), or with train.freeze_bn=true (running statistics)."""
    overrides = [f"{k}={v}" for k, v in TINY_RUN.items()] + [
        "data.batch_size=1", f"model.resolution={resolution}", f"train.freeze_bn={freeze_bn}",
        f"output={tmp_path}"]
    if trains:
        assert run(resolve(build_config(None, overrides)))["global_step"] == 1
    else:
        with pytest.raises(UsageError, match="data.batch_size=1 at model.resolution=32: the last BatchNorm"):
            resolve(build_config(None, overrides))
