"""Every setting of the schema through its boundary and odd values: the ends of its range, just
outside them, empty, null, NaN, inf, the wrong type, and a huge value where that cannot fill the
memory or fork without bound. Each value either resolves and trains a step of the tiny model or
is one UsageError line (exit 2 at the command line). In one process, through the same
``key=value`` parsing, resolve() and engine.run() the command line uses."""
import math
import shutil

import pytest

from mobilenet.config import AUTO_OR_BOOL, AUTO_OR_INT, CHOICES, DEFAULTS, RANGES, build_config, flatten, resolve
from mobilenet.engine import run
from mobilenet.errors import UsageError

# A run of one step of the smallest model on 16 synthetic images (the data settings: on the demo's
# JPEG files, where they apply).
TINY_RUN = {"data.path": "synthetic", "data.synthetic_size": 16, "data.batch_size": 4,
            "data.val_batch_size": 4, "data.workers": 0, "model.width_mult": 0.25, "model.resolution": 32,
            "model.num_classes": 4, "train.epochs": 1, "train.max_steps": 1, "train.log_every": 1}
# A huge value would allocate it (memory) or start that many processes.
NO_HUGE = {"model.width_mult", "model.num_classes", "model.resolution", "data.batch_size",
           "data.val_batch_size", "data.workers", "data.synthetic_size"}
ODD = ["", "null", "~", ".nan", ".inf", "-.inf", "[1]", "{a: 1}", "x", "true"]


def number_values(key, default):
    """The range's ends, the values just inside and just outside them, and a huge one."""
    interval = RANGES.get(key, "(-inf, inf)")
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    step = 1 if isinstance(default, int) and not isinstance(default, bool) else 1e-6
    values = []
    for bound, inside in ((low, step), (high, -step)):
        if math.isfinite(bound):
            values += [bound, bound + inside, bound - inside]
    if key not in NO_HUGE:
        values.append(10 ** 12)
    return [int(v) if step == 1 else v for v in values]


def values_of(key, default):
    if key in CHOICES:
        return sorted(CHOICES[key]) + ["bogus"] + ODD
    if isinstance(default, bool):
        return ["true", "false", "1"] + ODD
    if isinstance(default, list):
        ends = number_values(key, default[0])
        return [f"[{v}, {v}]" for v in ends] + ["[0.5]", "[0.5, 0.5, 0.5]"] + ODD
    if isinstance(default, (int, float)):
        return number_values(key, default) + ODD
    if key == "amp.loss_scale":
        return ["dynamic", 1, 65536, 0, -1, "static"] + ODD
    if key in AUTO_OR_BOOL:
        return ["auto", "true", "false"] + ODD
    if key in AUTO_OR_INT:
        return ["auto"] + number_values(key, 0) + ODD
    return ODD + ["synthetic", "digits", "1", "no/such/file"]  # paths: data, output, pretrained


CASES = [(key, value) for key, default in flatten(DEFAULTS) for value in values_of(key, default)]


def test_the_cases_cover_every_setting():
    assert {key for key, _ in CASES} == {key for key, _ in flatten(DEFAULTS)}
    assert len(CASES) > 400


def try_setting(key, value, folder, digits):
    """None when ``key=value`` trains a step or is refused in one line; else what went wrong."""
    settings = {**TINY_RUN}
    if key.startswith("data."):
        settings.update({"data.path": digits, "model.num_classes": 10})
    settings.pop(key, None)
    overrides = [f"{k}={v}" for k, v in settings.items()] + [f"{key}={value}"]
    if key != "output":
        overrides.append(f"output={folder}")
    try:
        cfg = resolve(build_config(None, overrides))
        if cfg["derived"]["compile"]:  # compiling takes half a minute: test_compile.py trains it
            return None
        run(cfg, start_over=True)
    except UsageError as e:
        if "\n" in str(e).strip() or not str(e).strip():
            return f"{key}={value}: a UsageError of {len(str(e).splitlines())} lines"
    except Exception as e:  # noqa: BLE001 - what this test looks for
        return f"{key}={value}: {type(e).__name__}: {str(e)[:200]}"
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
    monkeypatch.chdir(tmp_path)  # output= and relative paths land here
    failures = [problem for index, (key, value) in enumerate(CASES)
                if (problem := try_setting(key, value, tmp_path / f"case{index}", few_digits))]
    assert not failures, "\n".join(failures)


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
