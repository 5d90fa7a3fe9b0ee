import pytest
import torch

from mobilenet.checkpoint import load_checkpoint
from mobilenet.errors import UsageError
from mobilenet.model import MobileNetV1, load_weights, model_from_checkpoint


def test_paper_parameter_count_and_tensor_count():
    model = MobileNetV1()
    assert sum(p.numel() for p in model.parameters()) == 4_231_976
    assert len(list(model.parameters())) == 83


def test_table1_structure_at_224():
    model = MobileNetV1().eval()
    x = torch.zeros(1, 3, 224, 224)
    features = model.model[:14](x)  # stem + 13 blocks, before pooling
    assert features.shape == (1, 1024, 7, 7)
    assert model.model[0][0].stride == (2, 2)
    strides = [block[0].stride[0] for block in model.model[1:14]]
    assert strides == [1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1]  # last dw block has stride 1
    assert all(block[0].groups == block[0].in_channels for block in model.model[1:14])
    relus = sum(isinstance(m, torch.nn.ReLU) for m in model.modules())
    bns = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert relus == bns == 27  # BN + ReLU after every conv


@pytest.mark.parametrize("width,resolution,channels", [(0.75, 192, 768), (0.5, 160, 512),
                                                       (0.25, 128, 256)])
def test_width_multiplier_and_resolution(width, resolution, channels):
    model = MobileNetV1(width_mult=width, num_classes=10).eval()
    assert model.fc.in_features == channels
    assert model(torch.zeros(2, 3, resolution, resolution)).shape == (2, 10)


def modelzoo_checkpoint(model):
    """A dict laid out as Ascend ModelZoo saves it (DDP 'module.' prefix, .pth.tar keys)."""
    return {"epoch": 90, "arch": "mobilenet", "best_prec1": 69.813,
            "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()},
            "optimizer": {"state": {}, "param_groups": []}}


def test_loads_modelzoo_checkpoint(tmp_path):
    source = MobileNetV1()
    keys = source.state_dict().keys()
    assert {"model.0.0.weight", "model.1.3.weight", "model.13.4.running_var", "fc.bias"} <= keys
    path = tmp_path / "checkpoint.pth.tar"
    torch.save(modelzoo_checkpoint(source), path)
    target = MobileNetV1()
    load_weights(target, load_checkpoint(path), str(path))
    for key, value in source.state_dict().items():
        assert torch.equal(value, target.state_dict()[key]), key


def test_rejects_checkpoint_of_another_width(tmp_path):
    path = tmp_path / "half.pth.tar"
    torch.save(modelzoo_checkpoint(MobileNetV1(width_mult=0.5)), path)
    with pytest.raises(UsageError, match="half.pth.tar.*width_mult=1.0"):
        load_weights(MobileNetV1(), load_checkpoint(path), str(path))


def test_rejects_foreign_and_corrupt_files(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"encoder.weight": torch.zeros(1)}}, foreign)
    with pytest.raises(UsageError, match="foreign.pt: not a mobilenet_v1"):
        load_weights(MobileNetV1(), load_checkpoint(foreign), str(foreign))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(UsageError, match="corrupt.pt: not a readable checkpoint"):
        load_checkpoint(corrupt)


def test_another_model_from_the_table_trains_resumes_exactly_and_validates(tmp_path, digits, capsys, name="resnet18"):
    """model.name takes torchvision's models through the table (tests/test_tables.py trains every
    row): the demo trains resnet18, resumes it mid-epoch bit-identically, validates, says that it
    does not take model.width_mult, saves its arch, and another model's checkpoint is one line."""
    import json

    import train
    from conftest import TINY, assert_same_weights
    args = ["--config", "configs/demo.yaml", *TINY, "--data", str(digits), f"model.name={name}",
            "train.max_steps_per_epoch=4", "--epochs", "2"]
    assert train.main([*args, "--output", str(tmp_path / "straight")]) == 0
    said = capsys.readouterr().out
    assert "note: model.width_mult=0.25: resnet18 does not take it (it takes none of model.width_mult); ignored" in said
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "train.max_steps=6"]) == 0
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "--resume", "auto"]) == 0
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["val_images_scored"] == 360 and summary["epochs"] == 2
    saved = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")
    assert saved["arch"] == name and model_from_checkpoint(saved).__class__.__name__ != "MobileNetV1"
    checkpoint = tmp_path / "straight" / "checkpoints" / "last.pt"
    for start in (["--resume", str(checkpoint)], [f"model.pretrained={checkpoint}"]):  # into the default model
        capsys.readouterr()
        assert train.main([*args[:-1], "3", "model.name=mobilenet_v1", "--output", str(tmp_path / "other"),
                           *start]) == 2
        assert capsys.readouterr().err.strip() == (f"error: {checkpoint}: a {name} checkpoint (its arch), and this "
                                                   f"run builds mobilenet_v1 (model.name); pass model.name={name} "
                                                   f"to go on from it")


def test_a_run_is_the_same_in_a_fresh_process_and_after_other_runs_in_its_own(tmp_path, digits):
    """A model with dropout: what ran before in the process (another run, a cost estimate that
    builds a model) draws from torch's generator, and changes no draw of the run."""
    import train
    from conftest import TINY, assert_same_weights, run_train
    args = ["--config", "configs/demo.yaml", *TINY, "--data", str(digits), "model.name=mobilenet_v2",
            "train.max_steps_per_epoch=3", "--epochs", "1"]
    fresh = run_train(*args, "--output", tmp_path / "fresh")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    for run in ("first", "second"):
        torch.rand(7)  # whatever the process did before
        assert train.main([*args, "--output", str(tmp_path / run)]) == 0
        assert_same_weights(tmp_path / "fresh", tmp_path / run)
