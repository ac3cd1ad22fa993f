"""fxprop: static shape, dtype, device and stride inference over torch.fx graphs.

>>> import torch, fxprop
>>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()))
>>> out = fxprop.propagate(gm, fxprop.TensorSpec((2, 4)))
>>> tuple(out.shape)
(2, 8)
"""
from .cache import RuleCache, rule_cache
from .engine import DEFAULT_FALLBACK_LIMIT_BYTES, Provenance, propagate, repropagate
from .errors import (DeviceMismatchError, FallbackLimitError, FxpropError, InputError, PropagationError,
                     RuleRegistrationError)
from .rules import Kind, Rule, lookup, rule
from .specs import TensorSpec
from .symbolic import shape_of

__all__ = ["DEFAULT_FALLBACK_LIMIT_BYTES", "DeviceMismatchError", "FallbackLimitError", "FxpropError",
           "InputError", "Kind", "PropagationError", "Provenance", "Rule", "RuleCache", "RuleRegistrationError",
           "TensorSpec", "lookup", "propagate", "repropagate", "rule", "rule_cache", "shape_of"]
