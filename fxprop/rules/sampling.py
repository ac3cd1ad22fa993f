"""Random sampling: the meta kernels skip the argument checks the real samplers make first."""
from __future__ import annotations

import torch

from ..torch_compat import scalar_type_name
from ..resolve.registry import rule
from ..torch_compat import check

aten = torch.ops.aten


@rule(aten.multinomial.default)
def multinomial(self, num_samples, replacement=False, *, generator=None):
    """ATen's multinomial checks, in its order, before it draws."""
    check(0 < self.dim() <= 2, lambda: "prob_dist must be 1 or 2 dim")
    check(self.dtype.is_floating_point,
          lambda: f"multinomial only supports floating-point dtypes for input, got: {scalar_type_name(self.dtype)}")
    check(num_samples > 0, lambda: "cannot sample n_sample <= 0 samples")
    check(replacement or num_samples <= self.shape[-1],
          lambda: "cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    return aten.multinomial.default(self, num_samples, replacement, generator=generator)


def _uniform(op):
    """uniform / uniform_ draw from [from, to): real kernels refuse from > to."""
    def in_a_range(self, low=0.0, high=1.0, *, generator=None):
        check(low <= high, lambda: f"uniform_ expects to return a [from, to) range, but found from={low} > to={high}")
        return op(self, low, high, generator=generator)
    in_a_range.__name__ = in_a_range.__qualname__ = f"{op.__name__.replace('.', '_')}_in_a_range"
    return rule(op)(in_a_range)


_uniform(aten.uniform.default)
_uniform(aten.uniform_.default)
