"""fxprop: static shape, dtype, device and stride inference over torch.fx graphs.

>>> import torch, fxprop
>>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()))
>>> out = fxprop.propagate(gm, fxprop.TensorSpec((2, 4)))
>>> tuple(out.shape)
(2, 8)
"""
from . import rules  # noqa: F401  (registers the hand-written rules)
from .devices import factories, host_values, indexing  # noqa: F401  (fill the table of device rules)
from .memo.cache import RuleCache, rule_cache
from .engine.propagation import DEFAULT_FALLBACK_LIMIT_BYTES, Provenance, propagate, repropagate
from .estimate import Estimate, estimate
from .errors import (DataDependentError, DeviceMismatchError, FallbackLimitError, FxpropError, InputError,
                     InternalError, NodeError, PropagationError, RuleRegistrationError, UnsupportedError)
from .kinds import Kind, Rule
from .resolve.lookup import lookup
from .distributed.meshes import mesh_simulation, release_simulated_mesh, simulated_mesh
from .compile_backend import backend
from .resolve.registry import registered_rules, rule, unregister
from .engine.inputs import TensorSpec
from .symbolic import shape_of

__all__ = ["DEFAULT_FALLBACK_LIMIT_BYTES", "backend", "DataDependentError", "DeviceMismatchError", "Estimate", "FallbackLimitError",
           "FxpropError", "InputError", "InternalError", "Kind", "NodeError", "PropagationError", "Provenance", "Rule",
           "RuleCache", "RuleRegistrationError", "TensorSpec", "UnsupportedError", "estimate", "lookup", "mesh_simulation",
           "propagate", "registered_rules", "release_simulated_mesh", "repropagate", "rule", "rule_cache", "shape_of",
           "simulated_mesh", "unregister"]
