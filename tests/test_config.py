import pytest

from conftest import TINY, run_train
from mobilenet.config import DEFAULTS, UsageError, build_config


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
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_cli_rejects_unknown_key_and_bad_value(tmp_path):
    assert_one_line_error(run_train("--output", tmp_path, "train.epochz=1"), "train.epochz")
    assert_one_line_error(run_train("--output", tmp_path, "optim.lr=fast"), "optim.lr")
    assert_one_line_error(run_train("--config", tmp_path / "none.yaml"), "none.yaml")


def test_cli_rejects_missing_data_folder(tmp_path):
    missing = tmp_path / "imagenet"
    assert_one_line_error(run_train("--data", missing, "--output", tmp_path / "run", *TINY),
                          str(missing), "train")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_cli_rejects_class_count_mismatch(tmp_path, digits):
    result = run_train("--data", digits, "--output", tmp_path, *TINY, "model.num_classes=1000",
                       "--config", "configs/demo.yaml")
    assert_one_line_error(result, "10 classes", "model.num_classes=1000")
