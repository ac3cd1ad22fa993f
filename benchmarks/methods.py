"""The three ways of annotating a graph that the benchmark compares."""
from __future__ import annotations

from typing import Callable

import torch


def run_fxprop(gm, case):
    import fxprop
    fxprop.propagate(gm, *case.meta_inputs)


def run_fake_tensor_prop(gm, case):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) for x in case.meta_inputs])


def run_shape_prop(gm, case):
    from torch.fx.passes.shape_prop import ShapeProp
    with torch.no_grad():
        ShapeProp(gm).propagate(*case.real_inputs)


METHODS: dict[str, Callable] = {"fxprop": run_fxprop, "FakeTensorProp": run_fake_tensor_prop,
                                "ShapeProp": run_shape_prop}
