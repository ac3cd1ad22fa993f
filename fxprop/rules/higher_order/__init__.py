"""Higher-order operators: ops that call graphs (cond's branches, a loop's body, a block under no_grad).

Each rule walks the op's subgraphs through the engine (`Session.walk_subgraph`), so that their own
nodes are annotated too, with the values they take when torch's eager kernel
(``torch/_higher_order_ops/``) calls them, and builds the op's result from theirs as that kernel
does. Two conventions come from those kernels:

- cond, while_loop, map, scan, associative_scan and flex_attention run their subgraphs inside an
  autograd Function: the subgraphs compute without grad, and every floating-point result requires
  grad as soon as one input does (`through_autograd_function`). Ops that stand for a plain call
  (grad-mode and autocast regions, checkpointing, invoke_subgraph) run theirs as that call would.
- where a result's metadata would depend on the data (cond's branches disagreeing in a size, the
  ints a loop carries), it is a fresh symbol, as in torch's fake kernels.

The rules are filed by what the op does: `regions` (plain calls of a subgraph), `autocast`,
`control_flow`, `flex_attention` and `effects` (functionalized mutation, effects, ``print``); `common`
holds what they share.

Where a subgraph's results land (their devices) is decided by the subgraph, so these ops have a
device rule of their own that leaves the results as the rule built them (`placed_by_subgraphs`).
"""
from __future__ import annotations

import torch

from ...devices.transfers import transfer
from . import autocast, control_flow, effects, flex_attention, regions  # noqa: F401  (register the rules)
from .common import placed_by_subgraphs

higher_order = torch.ops.higher_order

transfer(higher_order.wrap_with_set_grad_enabled, higher_order.wrap_with_autocast, higher_order.wrap,
         higher_order.tag_activation_checkpoint, higher_order.wrap_activation_checkpoint, higher_order.invoke_subgraph,
         higher_order.hints_wrapper, higher_order.cond, higher_order.while_loop, higher_order.while_loop_stack_output,
         higher_order.map_impl, higher_order.scan, higher_order.associative_scan, higher_order.flex_attention,
         higher_order.with_effects, name="higher-order op: its subgraphs place its results")(placed_by_subgraphs)
