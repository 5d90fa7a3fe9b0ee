"""The EMA of the weights: torch's AveragedModel's averages with a few multi-tensor ops."""
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from benchmarks.harness import count_ops
from mobilenet.training import WeightEMA
from mobilenet.model import MobileNetV1


def train_steps(net, steps, after_step):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    net.train()
    for _ in range(steps):
        images = torch.randn(8, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (8,), generator=generator)
        torch.nn.functional.cross_entropy(net(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
        after_step()


def test_same_averages_as_averaged_model_over_many_steps():
    torch.manual_seed(0)
    net = MobileNetV1(width_mult=0.25, num_classes=10)
    ours = WeightEMA(net, 0.9)
    torch_ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)

    def update_both():
        ours.update()
        torch_ema.update_parameters(net)
    train_steps(net, 40, update_both)
    theirs = torch_ema.module.state_dict()
    for key, value in ours.module.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, theirs[key], rtol=1e-5, atol=1e-6, msg=key)
        else:  # integer buffers are copied (AveragedModel truncates an average of counts)
            assert torch.equal(value, net.state_dict()[key]), key
    assert ours.state_dict().keys() == torch_ema.state_dict().keys()
    assert int(ours.state_dict()["n_averaged"]) == int(torch_ema.n_averaged) == 40


def test_loads_the_state_that_averaged_model_wrote():
    """Checkpoints written before this EMA (torch's AveragedModel state) resume into it."""
    torch.manual_seed(0)
    net = MobileNetV1(width_mult=0.25, num_classes=10)
    torch_ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    train_steps(net, 3, lambda: torch_ema.update_parameters(net))
    ours = WeightEMA(MobileNetV1(width_mult=0.25, num_classes=10), 0.9)
    ours.load_state_dict(torch_ema.state_dict())
    assert ours.updates == 3
    for key, value in torch_ema.module.state_dict().items():
        assert torch.equal(ours.module.state_dict()[key], value), key


def test_an_update_is_a_few_ops_and_follows_reassigned_parameter_data():
    net = MobileNetV1(width_mult=0.25, num_classes=10)
    ema = WeightEMA(net, 0.5)
    ema.update()
    assert count_ops(ema.update) == 2  # one lerp (all fp32 tensors), one copy (num_batches_tracked)
    # an optimizer that moves the parameters into one zeroed combined buffer (as torch_npu's
    # NpuFused* do at their first step): the EMA must average towards the new storage
    before = {k: v.clone() for k, v in ema.module.named_parameters()}
    flat = torch.zeros(sum(p.numel() for p in net.parameters()))
    offset = 0
    for p in net.parameters():
        p.data = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    ema.update()
    for key, value in ema.module.named_parameters():
        torch.testing.assert_close(value, before[key] * 0.5, msg=key)
