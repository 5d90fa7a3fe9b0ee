import pytest
import torch

from mobilenet.checkpoint import load_checkpoint
from mobilenet.errors import UsageError
from mobilenet.model import MobileNetV1, load_weights


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
    with pytest.raises(UsageError, match="foreign.pt: not a MobileNetV1"):
        load_weights(MobileNetV1(), load_checkpoint(foreign), str(foreign))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(UsageError, match="corrupt.pt: not a readable checkpoint"):
        load_checkpoint(corrupt)
