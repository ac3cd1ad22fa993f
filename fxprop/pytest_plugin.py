"""pytest plugin: the ``fxprop_check`` fixture, for a backend's own test suite.

Installing fxprop registers this plugin (the ``pytest11`` entry point ``fxprop``), so any
test can ask for the fixture::

    def test_my_lowering_keeps_shapes(fxprop_check):
        gm = my_backend.lower(torch.fx.symbolic_trace(model))
        fxprop_check.assert_matches_real(gm, torch.randn(8, 16))
        fxprop_check.assert_no_fallback(gm)

    def test_my_op_rule(fxprop_check):
        @fxprop_check.register_rule(torch.ops.mylib.window_sum.default)
        def window_sum(x, width):
            return x.new_empty((*x.shape[:-1], x.shape[-1] - width))
        fxprop_check.check_rule(torch.ops.mylib.window_sum.default, torch.randn(4, 10), 3)

Rules registered through the fixture are removed when the test ends. Without the entry
point (fxprop not installed), enable the plugin with ``-p fxprop.pytest_plugin`` or
``pytest_plugins = ["fxprop.pytest_plugin"]`` in a top-level conftest.py.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest


class FxpropCheck:
    """The object the ``fxprop_check`` fixture yields: fxprop.testing, plus test-scoped rules."""

    def __init__(self) -> None:
        self._registered: list[Any] = []

    def assert_matches_real(self, gm, *inputs: Any, check_strides: bool = True, **options: Any) -> None:
        """`fxprop.testing.assert_matches_real`: every node of ``gm`` against a real run."""
        from .testing import assert_matches_real
        assert_matches_real(gm, *inputs, check_strides=check_strides, **options)

    def check_rule(self, target: Any, *sample_args: Any, check_strides: bool = True, **kwargs: Any) -> Any:
        """`fxprop.testing.check_rule`: one op against a real run; returns fxprop's result."""
        from .testing import check_rule
        return check_rule(target, *sample_args, check_strides=check_strides, **kwargs)

    def assert_no_fallback(self, gm) -> None:
        """Fail when any node of an already propagated ``gm`` needed the real-tensor fallback."""
        fell_back = [(node.name, node.meta["fxprop"].rule) for node in gm.graph.nodes
                     if "fxprop" in node.meta and node.meta["fxprop"].kind == "fallback"]
        if fell_back:
            raise AssertionError(f"{len(fell_back)} node(s) needed the real-tensor fallback (register a rule "
                                 "for their ops):\n" + "\n".join(f"  %{name}: {rule}" for name, rule in fell_back))

    def register_rule(self, *targets: Any, name: str | None = None) -> Callable[[Callable], Callable]:
        """`fxprop.rule`, undone when the test ends."""
        from .resolve.registry import rule

        def register(fn: Callable) -> Callable:
            rule(*targets, name=name)(fn)
            self._registered.extend(targets)
            return fn
        return register

    def close(self) -> None:
        from .resolve.registry import unregister
        while self._registered:
            unregister(self._registered.pop())


@pytest.fixture
def fxprop_check():
    """Check fxprop's annotations against real execution (see `fxprop.pytest_plugin`)."""
    check = FxpropCheck()
    try:
        yield check
    finally:
        check.close()
