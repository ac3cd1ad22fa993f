"""Who is to blame when a node fails: the model, fxprop's limits, or fxprop itself.

A failure is the model's (`PropagationError`) only where real execution would refuse too:
torch refused the call (its checks, its kernels, its argument parsing) or the user's own
code raised. A failure is fxprop's own (`InternalError`) when the exception started in
fxprop's code, outside the few lines where fxprop hands a call to torch (`boundary`).
Failures that come from having no data (a meta tensor asked for values, a size that depends
on data) are `UnsupportedError`s: the model is fine, fxprop cannot answer.

Hand-written rules refuse through ``torch._check`` (whose exception starts in torch) or by
raising an `FxpropError`; any other exception escaping a rule's own lines is the rule's bug.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from ..resolve import registry
from .. import torch_compat
from ..errors import DataDependentError, FxpropError, InternalError, NodeError, PropagationError, UnsupportedError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch_compat.torch.__file__))
_BOUNDARIES: set = set()

# torch's python kernels, which check with ``assert`` where the C++ kernels raise RuntimeError.
_PYTHON_KERNEL_PARTS = ("_refs", "_prims", "_prims_common", "_decomp", "_meta_registrations.py", "_subclasses")

# torch's words for "this needs data a meta tensor does not have".
# "data is not allocated yet": a C++ kernel wrote or read the memory of a tensor it made, which on meta
# has none (ctc_loss's composite builds a tensor from a python list of lengths that way). "but got
# meta": a kernel that asserts a real device (a strided nested tensor's storage).
_NO_DATA_PHRASES = ("meta tensor", "'meta' backend", "data-dependent", "no data!", "copy out of meta", "but got meta",
                    "unbacked symbol", "data is not allocated yet")


def boundary(fn: Callable) -> Callable:
    """Mark ``fn`` as a place where fxprop hands a call to torch or to the user's code: an
    exception raised by the callee's C++ directly in this frame is the callee's, not fxprop's."""
    _BOUNDARIES.add(fn.__code__)
    return fn


def blame(error: BaseException) -> NodeError:
    """The `NodeError` that says who failed, with ``error`` as its cause (not yet placed at a node)."""
    if isinstance(error, NodeError):
        return error
    if isinstance(error, FxpropError):  # an InputError or registration error raised mid-walk is fxprop's doing
        return _caused(InternalError(f"{type(error).__name__}: {error}"), error)
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, torch_compat.DATA_DEPENDENT_ERRORS):
        return _caused(DataDependentError(f"the result depends on the data: {_first_line(error)}"), error)
    frame = _fxprop_frame(error)
    if frame is not None:
        return _caused(InternalError(f"{text}, raised in {_where(frame)}"), error)
    if any(phrase in str(error).lower() for phrase in _NO_DATA_PHRASES):
        return _caused(UnsupportedError(text), error)
    if type(error) is AssertionError and "not supported in refs" in str(error):
        return _caused(UnsupportedError(f"{text} (torch's python reference kernel cannot take this argument)"), error)
    return _caused(PropagationError(text, error_type=_real_error_type(error)), error)


def _real_error_type(error: BaseException) -> type:
    """The type real execution raises for this refusal: a python meta kernel's failed ``assert``,
    or the ValueError of a python reference's argument check (``alpha``'s type), stands for a C++
    ``TORCH_CHECK``, which raises RuntimeError."""
    if type(error) in (AssertionError, ValueError) and _raised_in_python_kernel(error):
        return RuntimeError
    return type(error)


def _raised_in_python_kernel(error: BaseException) -> bool:
    traceback = error.__traceback__
    if traceback is None:
        return False
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    path = os.path.abspath(traceback.tb_frame.f_code.co_filename)
    if not path.startswith(_TORCH_DIR + os.sep):
        return False
    first_part = os.path.relpath(path, _TORCH_DIR).split(os.sep)[0]
    return first_part in _PYTHON_KERNEL_PARTS


def _fxprop_frame(error: BaseException) -> Any:
    """The innermost frame that is not a helper of the user's, when it is fxprop's: its own code
    or a registered rule's body (else None). A torch frame there means torch refused; a boundary
    frame means the callee (torch's C++, the user's module) raised directly."""
    frames = []
    traceback = error.__traceback__
    while traceback is not None:
        frames.append(traceback)
        traceback = traceback.tb_next
    for frame in reversed(frames):
        code = frame.tb_frame.f_code
        if code in _BOUNDARIES:
            return None
        path = os.path.abspath(code.co_filename)
        if path.startswith(_PACKAGE_DIR + os.sep) or registry.is_rule_code(code):
            return frame
        if path.startswith(_TORCH_DIR + os.sep):
            return None
    return None


def _where(frame: Any) -> str:
    code = frame.tb_frame.f_code
    return f"{getattr(code, 'co_qualname', code.co_name)} ({os.path.basename(code.co_filename)}:{frame.tb_lineno})"


def _caused(placed: NodeError, cause: BaseException) -> NodeError:
    placed.__cause__ = cause
    return placed


def _first_line(error: Any) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
