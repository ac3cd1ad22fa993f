"""What a traced step holds on its device: model state, gradients, activations, and the peaks.

`figures(step, est, memory)` reads one `TracedStep`'s estimate on the step's device:

- *resident*: what the step's inputs and constants hold from start to end: parameters, buffers,
  the optimizer's state and the batch;
- *gradients live* after a node: the gradients made so far (each lives from the node that makes
  it to the end of the step: ``p.grad`` keeps it until ``zero_grad``);
- *activations* after a node: everything else live then: tensors saved for the backward, and
  the temporaries of the forward, the backward and the optimizer step;
- the *peak* is the most bytes live at once, and the *activation peak* the most activation bytes
  at once, each with the node after which it occurs and that node's phase; ``phase_peaks`` has
  the activation peak of each phase (forward, backward, optimizer step).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from .memory import MemoryTrace
from .result import Estimate
from .traced_step import TracedStep


@dataclass(frozen=True)
class PeakAt:
    """Live bytes after one node: the node, its op, its phase, and what the bytes are."""
    node: str
    op: str
    phase: str
    bytes: int
    gradient_bytes: int
    activation_bytes: int


@dataclass(frozen=True)
class StepFigures:
    """A step's memory on its device and its FLOPs (bytes are ints; see the module's definitions)."""
    device: str
    parameters: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    optimizer_state_elsewhere: dict[str, int]
    buffer_bytes: int
    input_bytes: int
    resident_bytes: int
    peak: PeakAt
    activation_peak: PeakAt
    phase_peaks: dict[str, PeakAt]
    flops: int
    tokens: int
    flops_unknown: dict[str, str]
    stood_in: int
    comm: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def flops_per_token(self) -> float:
        return self.flops / self.tokens

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "flops_per_token": self.flops_per_token}


def figures(step: TracedStep, est: Estimate, memory: MemoryTrace, tokens: int,
            comm: Mapping[str, Mapping[str, int]] | None = None) -> StepFigures:
    """The figures of ``step`` on its device, from its estimate and the walk it was read from; ``comm``,
    the collectives of a rank's step by kind (`fxprop.distributed.dtensors.tally`)."""
    device = str(step.device)
    gradient_made_by: dict[str, int] = {}
    for key in dict.fromkeys(key for node in step.gm.graph.nodes if node.name in step.gradients
                             for key in memory.keys_of[node]):
        storage = memory.storages[key]
        if storage.device == device and storage.created_by is not None:
            gradient_made_by[storage.created_by] = gradient_made_by.get(storage.created_by, 0) + storage.nbytes
    resident = est.input_bytes.get(device, 0) + est.state_bytes.get(device, 0)
    at_nodes, gradients_live = [], 0
    for node in est.nodes:
        gradients_live += gradient_made_by.get(node.name, 0)
        live = node.live_bytes.get(device, 0)
        at_nodes.append(PeakAt(node.name, node.target, step.phases.get(node.name, ""), live, gradients_live,
                               live - resident - gradients_live))
    sizes = step.sizes
    return StepFigures(
        device=device, parameters=sizes.parameters, parameter_bytes=sizes.parameter_bytes,
        gradient_bytes=sum(gradient_made_by.values()),
        optimizer_state_bytes=sizes.optimizer_state_bytes.get(device, 0),
        optimizer_state_elsewhere={where: size for where, size in sizes.optimizer_state_bytes.items()
                                   if where != device},
        buffer_bytes=sizes.buffer_bytes, input_bytes=sizes.input_bytes, resident_bytes=resident,
        peak=max(at_nodes, key=lambda at: at.bytes),  # max keeps the first of equals, as Estimate does
        activation_peak=max(at_nodes, key=lambda at: at.activation_bytes), phase_peaks=_phase_peaks(at_nodes),
        flops=est.flops, tokens=tokens, flops_unknown=dict(est.flops_unknown),
        stood_in=step.stood_in, comm={kind: dict(entry) for kind, entry in (comm or est.comm).items()})


def _phase_peaks(at_nodes: list[PeakAt]) -> dict[str, PeakAt]:
    peaks: dict[str, PeakAt] = {}
    for at in at_nodes:
        if at.phase and (at.phase not in peaks or at.activation_bytes > peaks[at.phase].activation_bytes):
            peaks[at.phase] = at
    return peaks
