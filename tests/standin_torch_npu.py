"""A STAND-IN for torch_npu, only to test that the factory selects and drives the NPU classes.

It runs torch's SGD/Adam/... on CPU tensors under the NpuFused* names and imitates the one rule of
the real classes that our wiring must respect: zero_grad(set_to_none=True) raises ValueError.
It proves nothing about the real torch_npu kernels.
"""
import types

import torch


def _stand_in(base, name):
    class StandIn(base):
        def zero_grad(self, set_to_none=True):
            if set_to_none:
                raise ValueError("NpuFused optimizers keep combined grads: use set_to_none=False")
            super().zero_grad(set_to_none=False)
    StandIn.__name__ = StandIn.__qualname__ = name
    return StandIn


optim = types.SimpleNamespace(
    NpuFusedSGD=_stand_in(torch.optim.SGD, "NpuFusedSGD"),
    NpuFusedAdam=_stand_in(torch.optim.Adam, "NpuFusedAdam"),
    NpuFusedAdamW=_stand_in(torch.optim.AdamW, "NpuFusedAdamW"),
    NpuFusedRMSprop=_stand_in(torch.optim.RMSprop, "NpuFusedRMSprop"),
)
