"""The models the app trains, one table (MODELS), and MobileNetV1 (Howard et al. 2017, Table 1) in
Ascend ModelZoo's layout: ``model`` holds the stem (0), 13 blocks ``[dw conv, bn, relu, pw conv,
bn, relu]`` (1-13) and the pooling (14), ``fc`` the classifier, so its keys load unchanged."""
import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from mobilenet.errors import UsageError

# (output channels, stride) of the 13 depthwise-separable blocks, Table 1 of the paper.
BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
          (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1)]
STEM_CHANNELS = 32


def conv_bn_relu(inp, oup, kernel, stride, groups=1):
    return [nn.Conv2d(inp, oup, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(oup), nn.ReLU(inplace=True)]


class MobileNetV1(nn.Module):
    def __init__(self, width_mult=1.0, num_classes=1000):
        super().__init__()
        if width_mult <= 0 or num_classes < 1:
            raise ValueError("width_mult must be > 0 and num_classes >= 1")
        self.width_mult, self.num_classes = width_mult, num_classes

        def width(c):
            return max(1, int(c * width_mult))

        inp = width(STEM_CHANNELS)
        layers = [nn.Sequential(*conv_bn_relu(3, inp, 3, 2))]
        for out, stride in BLOCKS:
            out = width(out)
            layers.append(nn.Sequential(*conv_bn_relu(inp, inp, 3, stride, groups=inp),
                                        *conv_bn_relu(inp, out, 1, 1)))
            inp = out
        layers.append(nn.AdaptiveAvgPool2d(1))  # AvgPool2d(7) at 224; any resolution here
        self.model = nn.Sequential(*layers)
        self.fc = nn.Linear(inp, num_classes)
        self._init_weights()

    def _init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.fc(torch.flatten(self.model(x), 1))


def halvings(resolution, times):
    """The side of a feature map after ``times`` stride-2 stages (padding keeps ceil(side / 2))."""
    for _ in range(times):
        resolution = (resolution - 1) // 2 + 1
    return resolution


def torchvision_model(name, width_mult, num_classes):
    """torchvision's ``name`` with random weights; ``width_mult`` where the model takes one."""
    import torchvision
    width = {"width_mult": width_mult} if "width_mult" in model_row(name).takes else {}
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **width)


@dataclass(frozen=True)
class Model:
    """A model: ``build(width_mult, num_classes)``; ``takes``: its model.* settings of OPTIONAL;
    ``last_side(resolution)``: the smallest map a BatchNorm of it normalises (None: a forward pass
    counts it); its -a/--arch aliases; ``weights(state)``: a checkpoint's weights in its own keys."""
    build: Callable
    takes: tuple = ()
    last_side: Callable = None
    aliases: tuple = ()
    weights: Callable = lambda state: state


# The one table of models: model.name, -a/--arch, the checkpoints' "arch" and the benchmarks read it.
# A classification model of torchvision's that it does not hold is built by name too (model_row).
MODELS = {
    "mobilenet_v1": Model(lambda width, classes: MobileNetV1(width, classes), ("width_mult",), lambda r: halvings(r, 5),
                          aliases=("mobilenet", "mobilenetv1")),  # ModelZoo's own keys and arch name
    "mobilenet_v2": Model(functools.partial(torchvision_model, "mobilenet_v2"), ("width_mult",),
                          lambda r: halvings(r, 5)),
    "resnet18": Model(functools.partial(torchvision_model, "resnet18"), (), lambda r: halvings(r, 5)),
}
OPTIONAL = ("width_mult",)  # the model.* settings a row may take or not


def model_row(name):
    """The row of model ``name``, or one made for a classification model of torchvision's; or None."""
    return MODELS.get(name) or torchvision_row(name)


@functools.cache
def torchvision_row(name):
    import torchvision
    if name not in torchvision.models.list_models(module=torchvision.models):
        return None
    return Model(functools.partial(torchvision_model, name))


def model_name(arch):
    """The model.name of a name or alias (case as typed: ModelZoo's 'MobileNet' too), or None."""
    arch = str(arch).lower()
    found = next((name for name, model in MODELS.items() if arch == name or arch in model.aliases), None)
    return found or (arch if model_row(arch) else None)


def build_model(model_cfg):
    """The network of a ``model`` config section."""
    return model_row(model_cfg["name"]).build(model_cfg["width_mult"], model_cfg["num_classes"])


def last_side(name, resolution):
    """The smallest map side a BatchNorm of ``name`` normalises at ``resolution`` (None: none)."""
    row = model_row(name)
    return row.last_side(resolution) if row.last_side else smallest_normalised_side(name, resolution)


@functools.cache
def smallest_normalised_side(name, resolution):
    """last_side from one forward pass of a built model (a row that does not say it)."""
    sides = []
    net = build_model({"name": name, "width_mult": 1.0, "num_classes": 10}).eval()
    hooks = [m.register_forward_hook(lambda module, inputs, output: sides.append(min(output.shape[2:], default=1)))
             for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.num_features]
    try:
        with torch.no_grad():
            net(torch.zeros(1, 3, resolution, resolution))
    except RuntimeError as e:
        raise UsageError(f"model.resolution={resolution}: too small for {name} "
                         f"({str(e).splitlines()[0][:120]})") from None
    finally:
        for hook in hooks:
            hook.remove()
    return min(sides) if sides else None


@functools.cache
def multiply_adds(name, width_mult, resolution, num_classes=1000):
    """Multiply-adds of one forward pass of model ``name`` (counted once per shape)."""
    row = model_row(name)
    return count_multiply_adds(row.build(width_mult if "width_mult" in row.takes else 1.0, num_classes), resolution)


def relative_cost(model_cfg):
    """The model's multiply-adds over MobileNetV1's at width 1.0 and 224 px (the measured anchor)."""
    return (multiply_adds(model_cfg["name"], model_cfg["width_mult"], model_cfg["resolution"])
            / multiply_adds("mobilenet_v1", 1.0, 224))


def output_classes(net):
    """The class count of a built network: its last Linear layer's outputs."""
    return [module for module in net.modules() if isinstance(module, nn.Linear)][-1].out_features


def unwrap_state_dict(checkpoint):
    """Model weights from ours, ModelZoo's or bare state dicts, without DDP's ``module.`` prefix."""
    state = checkpoint.get("state_dict", checkpoint)
    return {k.removeprefix("module."): v for k, v in state.items()}


def check_same_model(checkpoint, name, path="checkpoint"):
    """A UsageError naming ``path`` when its 'arch' is another model than ``name``."""
    arch = model_name(checkpoint.get("arch")) if checkpoint.get("arch") else None
    if arch and arch != name:
        raise UsageError(f"{path}: a {arch} checkpoint (its arch), and this run builds {name} (model.name); "
                         f"pass model.name={arch} to go on from it")


def load_weights(model, checkpoint, path="checkpoint", name="mobilenet_v1"):
    """Loads weights strictly into ``model``; a mismatch is a UsageError naming ``path``."""
    check_same_model(checkpoint, name, path)
    state = model_row(name).weights(unwrap_state_dict(checkpoint))
    own = model.state_dict()
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    if missing or unexpected:
        raise UsageError(f"{path}: not a {name} checkpoint (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    for key, value in state.items():
        if value.shape != own[key].shape:
            built = (f" (width_mult={model.width_mult}, num_classes={model.num_classes})"
                     if isinstance(model, MobileNetV1) else "")
            raise UsageError(f"{path}: {key} has shape {tuple(value.shape)}, the {name} model{built} "
                             f"needs {tuple(own[key].shape)}")
    model.load_state_dict(state)


def model_from_checkpoint(checkpoint, path="checkpoint"):
    """The model a checkpoint holds, with its weights (ModelZoo's and bare ones: a MobileNetV1)."""
    model_cfg = (checkpoint.get("config") or {}).get("model")
    if model_cfg and model_cfg.get("name", "mobilenet_v1") != "mobilenet_v1":
        model = build_model(model_cfg)
        load_weights(model, checkpoint, path, model_cfg["name"])
        return model
    state = unwrap_state_dict(checkpoint)
    try:
        width = state["model.0.0.weight"].shape[0] / STEM_CHANNELS
        classes = state["fc.weight"].shape[0]
    except KeyError:
        raise UsageError(f"{path}: not a mobilenet_v1 checkpoint (no model.0.0.weight/fc.weight)") from None
    model = MobileNetV1(width, classes)
    load_weights(model, state, path)
    return model


def count_multiply_adds(model, resolution):
    """Multiply-adds of one forward pass at ``resolution``, counted from the convs and the fc."""
    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            total += output.numel() * (module.in_channels // module.groups) * kh * kw
        else:
            total += module.in_features * module.out_features
    hooks = [m.register_forward_hook(count) for m in model.modules()
             if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, resolution, resolution))
    model.train(was_training)
    for hook in hooks:
        hook.remove()
    return total
