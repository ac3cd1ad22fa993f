"""Per-op rules and the lookup order shared by the engine and the coverage report."""
from .registry import (Kind, Rule, decomposition_for, has_meta_kernel, lookup, python_rule, registered_rules,
                       rule, shape_rule, target_name, unregister)
from . import attention, conv, cuda_kernels, data_dependent, fuzz_fixes  # noqa: F401  (register hand-written rules)
from . import device_hints, normalization, strides  # noqa: F401  (fixes found by the OpInfo sweep)
from . import recurrent  # noqa: F401  (recurrent modules over a symbolic number of steps)

__all__ = ["Kind", "Rule", "decomposition_for", "has_meta_kernel", "lookup", "python_rule", "registered_rules",
           "rule", "shape_rule", "target_name", "unregister"]
