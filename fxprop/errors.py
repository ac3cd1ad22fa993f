"""One family of exceptions for everything fxprop refuses, and who is to blame for a failure.

A node that cannot be propagated raises one of three `NodeError`s, each naming the node,
its op, its inputs and the user's source line:

- `PropagationError`: the model is wrong here, and real execution raises too. Its
  ``error_type`` is the exception real execution raises (torch's own, chained as
  ``__cause__`` when torch raised it).
- `UnsupportedError`: fxprop cannot answer for this node, through no fault of the model: no
  rule can run the op here (`FallbackLimitError`), or the answer depends on data a static pass
  does not have (`DataDependentError`).
- `InternalError`: fxprop itself failed (a rule's own bug). Always a bug to report.
"""
from __future__ import annotations


class FxpropError(Exception):
    """Base class of every error fxprop raises on purpose."""


class InputError(FxpropError, TypeError, ValueError):
    """`propagate` was called wrongly: the graph, the inputs or an option is not what it takes.

    Raised before any node is visited, so nothing has been annotated.
    """


class RuleRegistrationError(FxpropError, ValueError):
    """A rule was registered twice for one target, or for something that is not a target."""


class NodeError(FxpropError):
    """A node could not be propagated. Raised as one of its subclasses.

    Attributes:
        reason: what went wrong, without the node's context.
        node_name: the FX node's name (``None`` until the engine attaches the node).
        op: a readable name of the node's target.
        inputs: one line per tensor or value the node received.
        source: the user's source line from ``node.stack_trace``, when the tracer recorded one.
    """

    blame = "fxprop"

    def __init__(self, message: str, *, node_name: str | None = None, op: str | None = None,
                 inputs: tuple[str, ...] = (), source: str | None = None):
        self.reason = message
        self.node_name = node_name
        self.op = op
        self.inputs = inputs
        self.source = source
        super().__init__(self._render())

    def at_node(self, *, node_name: str, op: str, inputs: tuple[str, ...], source: str | None,
                reason: str | None = None) -> "NodeError":
        """The same error, placed at a node (a new exception of the same type and attributes)."""
        placed = self.__class__.__new__(self.__class__)
        placed.__dict__.update(self.__dict__)
        NodeError.__init__(placed, reason if reason is not None else self.reason, node_name=node_name, op=op,
                           inputs=inputs, source=source)
        return placed

    def _render(self) -> str:
        if self.node_name is None:
            return self.reason
        lines = [self.reason, f"  while propagating node %{self.node_name} ({self.op})"]
        lines += [f"    {described}" for described in self.inputs]
        lines.append(f"  source: {self.source}" if self.source else "  source: not recorded by the tracer")
        if self.blame == "fxprop":
            lines.append("  this is fxprop's failure, not the model's")
        return "\n".join(lines)


class PropagationError(NodeError):
    """The model is wrong at this node: real execution raises ``error_type`` here too."""

    blame = "model"

    def __init__(self, message: str, *, error_type: type[BaseException] | None = None, **node):
        self.error_type = error_type or RuntimeError
        super().__init__(message, **node)

    def refuses_like(self, real_error: BaseException) -> bool:
        """Whether real execution's ``real_error`` is the same refusal: the same exception type,
        as OpInfo's ``ErrorInput`` compares ``error_type``."""
        return type(real_error) is self.error_type


class DeviceMismatchError(PropagationError):
    """Tensors on two different devices met in one op, where torch would refuse them."""


class UnsupportedError(NodeError):
    """fxprop cannot propagate this node, and the model is not to blame: no rule can run the op
    here, or the op's result depends on data."""


class FallbackLimitError(UnsupportedError):
    """The real-tensor fallback would need more bytes than ``fallback_limit_bytes`` allows."""


class DataDependentError(UnsupportedError):
    """A value the graph needs concretely (a size, a branch, a python number) depends on the data."""


class InternalError(NodeError):
    """fxprop itself failed at this node: a bug in fxprop or in one of its rules."""
