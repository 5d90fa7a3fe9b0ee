"""An exponential moving average of a network's weights, updated with a few multi-tensor ops.

torch's AveragedModel rebuilds its tensor lists and reads its update count back to the host at
every update (some 440 launches a step for MobileNetV1); this one builds its lists once and keeps
the count on the host, so an update is one ``_foreach_lerp_`` per floating dtype and one
``_foreach_copy_`` for the integer buffers (BatchNorm's num_batches_tracked, which lerp refuses):
the same averages as ``AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(decay),
use_buffers=True)``, and its state-dict layout, so checkpoints load either way.
"""
import copy
import itertools
from collections import defaultdict

import torch


class WeightEMA:
    """``module``: the averaged copy of ``net`` (to evaluate). ``update()`` after each optimizer
    step: the first copies ``net``, later ones move each tensor by (1 - decay) towards ``net``'s.

    The lists hold ``net``'s Parameter and buffer objects, not views of their storage: an
    optimizer that moves parameters into combined buffers at its first step (torch_npu's NpuFused*)
    re-points ``param.data`` and the lists follow (unrun on npu)."""

    def __init__(self, net, decay):
        self.module = copy.deepcopy(net).eval().requires_grad_(False)
        self.decay, self.updates = decay, 0
        self.floating = defaultdict(lambda: ([], []))  # dtype -> (averaged, current)
        self.integer = ([], [])
        pairs = zip(tensors_of(self.module), tensors_of(net), strict=True)
        for averaged, current in pairs:
            lists = self.floating[averaged.dtype] if averaged.is_floating_point() else self.integer
            lists[0].append(averaged)
            lists[1].append(current)

    @torch.no_grad()
    def update(self):
        for averaged, current in self.floating.values():
            if self.updates == 0:
                torch._foreach_copy_(averaged, current)
            else:
                torch._foreach_lerp_(averaged, current, 1 - self.decay)
        if self.integer[0]:
            torch._foreach_copy_(*self.integer)
        self.updates += 1

    def state_dict(self):
        """AveragedModel's layout: ``n_averaged`` and the averaged module's tensors as ``module.*``."""
        return {"n_averaged": torch.tensor(self.updates),
                **{f"module.{k}": v for k, v in self.module.state_dict().items()}}

    def load_state_dict(self, state):
        self.module.load_state_dict({k.removeprefix("module."): v for k, v in state.items()
                                     if k.startswith("module.")})
        self.updates = int(state["n_averaged"])


def tensors_of(net):
    return itertools.chain(net.parameters(), net.buffers())
