"""Every result fxprop computes directly, by op: the tables of `direct` and its siblings, one per op family."""
from __future__ import annotations

from typing import Any

from .direct import DIRECT, direct_result
from .direct_backward import DIRECT_BACKWARD
from .direct_contiguous import DIRECT_CONTIGUOUS
from .direct_normalization import DIRECT_NORMALIZATION
from .direct_pointwise import DIRECT_POINTWISE
from .direct_reductions import DIRECT_REDUCTIONS
from .direct_views import DIRECT_VIEWS

SHORTCUTS = {**DIRECT, **DIRECT_BACKWARD, **DIRECT_CONTIGUOUS, **DIRECT_NORMALIZATION, **DIRECT_POINTWISE,
             **DIRECT_REDUCTIONS, **DIRECT_VIEWS}


def shortcut_result(op: Any, args: tuple, kwargs: dict) -> Any:
    """``op``'s meta result computed directly, or None where its meta kernel must run."""
    return direct_result(op, args, kwargs, SHORTCUTS)
