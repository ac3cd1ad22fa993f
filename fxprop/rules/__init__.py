"""Per-op rules and the lookup order shared by the engine and the coverage report."""
from .registry import (Kind, Rule, decomposition_for, has_meta_kernel, lookup, python_rule, registered_rules,
                       rule, shape_rule, target_name, unregister)
from . import attention, conv  # noqa: F401  (register hand-written rules)

__all__ = ["Kind", "Rule", "decomposition_for", "has_meta_kernel", "lookup", "python_rule", "registered_rules",
           "rule", "shape_rule", "target_name", "unregister"]
