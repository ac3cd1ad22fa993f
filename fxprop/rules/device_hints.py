"""Meta kernels that lay results out per backend see the node's logical device.

Some of torch's meta kernels choose strides or shapes by backend (svd's V is row-major on
CUDA and column-major on CPU; nonzero_static, the FFTs, embedding_bag, the pooling
kernels...). They ask ``torch._meta_registrations.device_hint(tensor)``, which can only
answer "cuda" for a plain meta tensor. FakeTensorMode answers with the fake device; while
fxprop propagates a node, this answers with the node's logical device. Outside
propagation, and for every tensor that is not on the meta device, torch's answer stands.
"""
from __future__ import annotations

import torch
import torch._meta_registrations as meta_registrations

from .. import context

_torch_device_hint = getattr(meta_registrations.device_hint, "__wrapped__", meta_registrations.device_hint)


def device_hint(tensor) -> str:
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta" \
            and not isinstance(tensor, torch._subclasses.FakeTensor):
        device = context.node_device()
        if device is not None and device.type != "meta":
            return device.type
    return _torch_device_hint(tensor)


device_hint.__wrapped__ = _torch_device_hint
meta_registrations.device_hint = device_hint
