"""One family of exceptions for everything fxprop refuses."""
from __future__ import annotations


class FxpropError(Exception):
    """Base class of every error fxprop raises on purpose."""


class InputError(FxpropError, TypeError, ValueError):
    """`propagate` was called wrongly: the graph or the inputs are not what it takes.

    Raised before any node is visited, so nothing has been annotated.
    """


class RuleRegistrationError(FxpropError, ValueError):
    """A rule was registered twice for one target, or for something that is not a target."""


class PropagationError(FxpropError):
    """A node could not be propagated: the model itself is wrong, or no rule could handle it.

    Attributes:
        node_name: the FX node's name (``None`` when the failure is not tied to one node).
        op: a readable name of the node's target.
        inputs: one line per tensor or value the node received.
        source: the user's source line from ``node.stack_trace``, when the tracer recorded one.
    """

    def __init__(self, message: str, *, node_name: str | None = None, op: str | None = None,
                 inputs: tuple[str, ...] = (), source: str | None = None):
        self.reason = message
        self.node_name = node_name
        self.op = op
        self.inputs = inputs
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        if self.node_name is None:
            return self.reason
        lines = [f"{self.reason}", f"  while propagating node %{self.node_name} ({self.op})"]
        for described in self.inputs:
            lines.append(f"    {described}")
        lines.append(f"  source: {self.source}" if self.source else "  source: not recorded by the tracer")
        return "\n".join(lines)


class FallbackLimitError(PropagationError):
    """The real-tensor fallback would have materialized more bytes than the configured cap."""


class DeviceMismatchError(PropagationError):
    """Tensors on two different devices met in one op, where torch would refuse them."""
