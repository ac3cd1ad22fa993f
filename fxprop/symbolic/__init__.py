"""Symbolic sizes: user symbols in, sympy expressions out, data-dependent sizes as bounded symbols.

fxprop computes symbolic shapes with torch's own machinery: one `ShapeEnv` per `propagate`
call, meta tensors whose sizes are `torch.SymInt`, and torch's meta kernels and
decompositions (run under the python dispatcher, which holds their symbolic versions).

Every symbol is *unbacked*: it has bounds but no example value, so no hint can leak into a
result. When a kernel must branch on a size it cannot decide from the bounds it either
takes the branch that is valid in general and records the condition with ``torch._check``
(these deferred runtime asserts are the *assumptions* fxprop returns), or raises. Before it
raises, fxprop decides the relation over the integers where it has one truth for every size
that satisfies the ranges and the assumptions (`deciding`: ``2*floor(H/2) - 2 >= H`` is never
true); otherwise fxprop names the op and its symbolic inputs instead of guessing.

One exception to torch's choices: where a pointwise op's broadcast cannot be decided, torch
takes the non-broadcasting path and assumes ``B == C``; fxprop assumes only what broadcasting
needs, ``B == 1 | C == 1 | B == C``, and gives the exact size ``Max(B, C)`` (`broadcast_inputs`).

Programs from torch.export are the exception to "every symbol is unbacked": a TensorSpec given
for a placeholder that export traced (``meta["val"]``, a FakeTensor of export's ShapeEnv) is
computed in that ShapeEnv, with *backed* symbols as export makes them, so that the re-annotated
program still saves, loads and decomposes. A name at a dim export made dynamic is that dim's
symbol (``s0``); any other name is a new backed symbol whose example value is the traced size
(`SymbolicSession.bind_traced`). Data-dependent symbols get the ``unbacked_bindings`` export
writes (`SymbolicSession.adopt`).

Internally the symbols are torch's (``u0``, ``u1``, ...); at the boundary (`shape_of`,
``gm.meta["fxprop"]``, error messages) they are renamed to the user's own symbols, and
fresh data-dependent symbols are renumbered ``u0``, ``u1``, ... in the order they appear.

    >>> import torch, fxprop
    >>> gm = torch.fx.symbolic_trace(torch.nn.Linear(16, 32))
    >>> _ = fxprop.propagate(gm, fxprop.TensorSpec(("B", 16)))
    >>> fxprop.shape_of(list(gm.graph.nodes)[-1])
    (B, 32)
"""
from .ambient import (broadcast_inputs, current, dispatcher, no_symbolic_rule, program_range, python_dispatcher,
                      scope, session_of, spec_to_meta, undecidable)
from .dims import SymbolInfo, check_dim, is_symbolic_dim, user_symbol
from .reading import host_sample, shape_of, user_shape
from .session import SymbolicSession, is_callers_env
from .sizes import broadcast_shapes, contiguous_strides, definitely_equal, has_symbolic, known_laid_out_in, resolve

__all__ = ["SymbolInfo", "SymbolicSession", "broadcast_inputs", "broadcast_shapes", "check_dim", "contiguous_strides",
           "current", "definitely_equal", "dispatcher", "has_symbolic", "host_sample", "is_callers_env",
           "is_symbolic_dim", "known_laid_out_in", "no_symbolic_rule", "program_range", "python_dispatcher", "resolve",
           "scope", "session_of", "shape_of", "spec_to_meta", "undecidable", "user_shape", "user_symbol"]
