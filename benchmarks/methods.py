"""The two ways of annotating a graph that the benchmark compares, called as a pipeline would."""
from __future__ import annotations

from typing import Callable


def run_fxprop(gm, case):
    import fxprop
    fxprop.propagate(gm, *case.meta_inputs)


def run_fake_tensor_prop(gm, case):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) for x in case.meta_inputs])


def clear_caches() -> None:
    """Empty both implementations' memo caches: fxprop's rule cache and FakeTensorMode's dispatch cache."""
    import fxprop
    from torch._subclasses.fake_tensor import FakeTensorMode
    fxprop.rule_cache.clear()
    FakeTensorMode.cache_clear()


METHODS: dict[str, Callable] = {"fxprop": run_fxprop, "FakeTensorProp": run_fake_tensor_prop}
