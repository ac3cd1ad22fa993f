"""Calls that change process-wide state: propagation never runs them.

Seeding torch's global RNG from inside a graph would reseed the caller's generator (and every
thread's). Propagation draws no random numbers, so seeding changes no result; these calls
return what they return for real without touching the generator.
"""
from __future__ import annotations

import torch

from .. import symbolic
from ..resolve.registry import rule


@rule(torch.manual_seed)
def manual_seed(seed) -> torch.Generator:
    """Returns the default generator, unseeded."""
    int(seed)  # torch refuses a seed that is not a number the same way
    return torch.default_generator


@rule(torch.seed)
def seed():
    """The seed torch would draw is unknowable: a fresh symbol."""
    return symbolic.current().fresh_value(torch.int64)


@rule(torch.set_rng_state)
def set_rng_state(new_state) -> None:
    return None
