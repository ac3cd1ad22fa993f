"""FSDP2 (`fully_shard`) models and their real runs, shared by the single-process tests (a simulated
CPU mesh, where FSDP's hooks run for real over torch's fake process group) and the gloo ranks
spawned by torch.multiprocessing (which import this module by name)."""
from __future__ import annotations

import gc
import os
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import fxprop
from fxprop.distributed import parallel

import distributed_cases as cases

C10D_AS_FUNCTIONAL = {"_allgather_base_": "all_gather_into_tensor", "_reduce_scatter_base_": "reduce_scatter_tensor",
                      "allreduce_": "all_reduce"}
"""FSDP calls ``torch.distributed.all_gather_into_tensor`` (c10d's ``_allgather_base_``): the
collective DTensor runs as the functional ``all_gather_into_tensor``, which fxprop records."""


def blocks_and_root_layers(mesh, **fully_shard_options) -> nn.Module:
    """Two FSDP blocks between two layers the root holds (its own group); 30 hidden units and 10
    outputs split unevenly over 4 ranks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), cases.MLP(dim=16, hidden=30, norm=True), cases.MLP(dim=16, hidden=30),
                          nn.Linear(16, 10))
    for block in model[1:3]:
        fully_shard(block, mesh=mesh, **fully_shard_options)
    return fully_shard(model, mesh=mesh, **fully_shard_options)


def grouped_blocks_and_root_layers(mesh) -> nn.Module:
    """`blocks_and_root_layers` with both blocks in one group (``fully_shard([a, b])``): gathered
    before the first runs, let go after the last."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), cases.MLP(dim=16, hidden=30, norm=True), cases.MLP(dim=16, hidden=30),
                          nn.Linear(16, 10))
    fully_shard([model[1], model[2]], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def blocks(mesh, **fully_shard_options) -> nn.Module:
    """Two FSDP blocks under a root that holds no parameter of its own."""
    torch.manual_seed(0)
    model = nn.Sequential(cases.MLP(dim=16, hidden=30, norm=True), cases.MLP(dim=16, hidden=30))
    for block in model:
        fully_shard(block, mesh=mesh, **fully_shard_options)
    return fully_shard(model, mesh=mesh, **fully_shard_options)


class ScaledHead(nn.Module):
    """A root whose forward reads parameters itself: its own ``scale`` and its head's weight (in
    the graph as ``get_attr`` nodes), around an FSDP block."""

    def __init__(self):
        super().__init__()
        self.block = cases.MLP(dim=16, hidden=30)
        self.head = nn.Linear(16, 10)
        self.scale = nn.Parameter(torch.ones(10))

    def forward(self, x):
        return nn.functional.linear(self.block(x), self.head.weight) * self.scale


def scaled_head(mesh) -> nn.Module:
    torch.manual_seed(0)
    model = ScaledHead()
    fully_shard(model.block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


class TiedEmbedding(nn.Module):
    """An embedding whose weight is its head's, around a block."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 16)
        self.block = cases.MLP(dim=16, hidden=30)
        self.head = nn.Linear(16, 10, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        return self.head(self.block(self.embedding(tokens)))


def tied_across_groups(mesh) -> nn.Module:
    """The tied weight managed twice: by the embedding's own group and by the root's (the head's)."""
    torch.manual_seed(0)
    model = TiedEmbedding()
    fully_shard(model.embedding, mesh=mesh)
    fully_shard(model.block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def grouped_without_root(mesh) -> nn.Module:
    """Two blocks in one group and no root `fully_shard`: the group is the first FSDP state to run."""
    torch.manual_seed(0)
    model = nn.Sequential(cases.MLP(dim=16, hidden=30), cases.MLP(dim=16, hidden=30))
    fully_shard([model[0], model[1]], mesh=mesh)
    return model


def block_run_before_its_root(mesh) -> nn.Module:
    """`blocks` after a forward of its first block alone, which made that block a root."""
    model = blocks(mesh)
    with torch.no_grad():
        model[0](torch.randn(2, 16))
    return model


def nested_three_levels(mesh) -> nn.Module:
    """FSDP modules three deep under the root, in one node of its graph: the outer block holds a
    layer and a middle block (kept gathered, ``reshard_after_forward=False``), which holds a layer
    and an inner block (resharded as its forward ends, inside the outer block's node)."""
    torch.manual_seed(0)
    inner = cases.MLP(dim=16, hidden=30)
    middle = nn.Sequential(nn.Linear(16, 16), inner)
    model = nn.Sequential(nn.Sequential(nn.Linear(16, 16), middle), nn.Linear(16, 10))
    fully_shard(inner, mesh=mesh)
    fully_shard(middle, mesh=mesh, reshard_after_forward=False)
    fully_shard(model[0], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def fsdp_over_tensor_parallel(mesh, hidden: int = 30) -> nn.Module:
    """`distributed_cases.fsdp_and_tensor_parallel` with ``hidden`` units: 30 split over tp in 15
    rows, which dp splits again unevenly (8 and 7) in strided shards."""
    torch.manual_seed(0)
    model = nn.Sequential(cases.MLP(hidden=hidden, norm=True), cases.MLP(hidden=hidden, norm=True))
    for block in model:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def llama_fsdp_over_tp_sp(mesh) -> nn.Module:
    """The Llama-style decoder with tensor and sequence parallelism on ``tp``, each layer and the root
    `fully_shard` on ``dp``."""
    model = cases.tiny_llama(mesh, fsdp=False, device="cpu")
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def describe(value):
    """`distributed_cases.describe`, with each tensor's dtype (FSDP's mixed precision casts)."""
    from torch.distributed.tensor import DTensor
    if isinstance(value, DTensor):
        return ("DTensor", tuple(value.placements), tuple(value.to_local().shape), tuple(value.shape), value.dtype)
    if isinstance(value, torch.Tensor):
        return ("Tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(describe(item) for item in value)
    return type(value).__name__


def eager_reference(model: nn.Module, *inputs, train: bool = False) -> tuple[dict, dict]:
    """The FSDP model run eagerly under CommDebugMode: each module's output described (dtype
    included), and the collectives by kind, c10d's named as their functional twins. The root's
    output is its forward's, as its graph returns it (before the root's post-forward hook casts it
    to the policy's ``output_dtype``); a called module's, its call's."""
    from torch.distributed.tensor.debug import CommDebugMode
    outputs: dict = {}
    handles = [module.register_forward_hook(lambda _, args, out, name=name: outputs.__setitem__(name, describe(out)),
                                            prepend=not name)
               for name, module in model.named_modules()]
    try:
        with CommDebugMode() as comm, torch.set_grad_enabled(train):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    counts: dict = {}
    for op, count in comm.get_comm_counts().items():
        kind = C10D_AS_FUNCTIONAL.get(str(op).split(".")[-1], str(op).split(".")[-1])
        counts[kind] = counts.get(kind, 0) + count
    return outputs, counts


def propagated(gm: torch.fx.GraphModule) -> tuple[dict, dict]:
    outputs = {str(node.target): describe(node.meta["val"]) for node in gm.graph.nodes if node.op == "call_module"}
    value = gm.graph.find_nodes(op="output")[0].meta["val"]
    outputs[""] = describe(value[0] if isinstance(value, tuple) and len(value) == 1 else value)
    return outputs, cases.propagated(gm)[1]


class Allocations(TorchDispatchMode):
    """Every tensor an op makes while the mode is on, held weakly: those still alive are the
    storages the run holds beyond the graph's values (FSDP's unsharded parameters, its all-gather
    output). An op on DTensors is seen once, with its DTensor results."""

    def __init__(self):
        super().__init__()
        self.made: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [weakref.ref(value) for value in tree_leaves(out) if isinstance(value, torch.Tensor)]
        return out

    def alive(self) -> list:
        return [value for reference in self.made if (value := reference()) is not None]


class LiveLocalBytesWithFsdp(cases.LiveLocalBytes):
    """`distributed_cases.LiveLocalBytes` of a real FSDP run: the graph runs as its root module's
    forward (FSDP's root hooks run around it, its blocks' hooks around their nodes), and the live
    storages also count every storage made during the run that is still alive (`Allocations`,
    FSDP's own included; a storage FSDP freed has no bytes). An FSDP module's node is measured as
    its forward ends, just before FSDP's post-forward hook lets its gathered parameters go: the
    bytes the module ran with, which `fxprop.estimate` reports just after that node."""

    def __init__(self, gm: torch.fx.GraphModule, allocations: Allocations):
        super().__init__(gm)
        self.allocations = allocations
        self.ending: int | None = None
        self.handles = [self.fetch_attr(node.target).register_forward_hook(self.module_ends, prepend=True)
                        for node in gm.graph.nodes
                        if node.op == "call_module" and isinstance(self.fetch_attr(node.target), FSDPModule)]

    def live_bytes(self, *values) -> int:
        gc.collect()  # a storage only a reference cycle holds is garbage, whenever the collector gets to it
        live = dict(self.held)
        for value in [*self.env.values(), *values, *self.allocations.alive()]:
            live.update(cases._local_storages(value))
        return sum(live.values())

    def module_ends(self, module, args, output) -> None:
        self.ending = self.live_bytes(output)

    def run_node(self, node):
        result = torch.fx.Interpreter.run_node(self, node)
        self.records.append((node.name, self.ending if self.ending is not None else self.live_bytes(result)))
        self.ending = None
        return result


def real_live_bytes(model: nn.Module, x: torch.Tensor) -> list:
    """This rank's live local storages after each node of ``model``'s traced graph, run for real
    as ``model``'s forward (its FSDP hooks included), without grad."""
    run = LiveLocalBytesWithFsdp(parallel.trace(model), Allocations())
    model.forward = lambda *args: run.run(*args)
    try:
        with torch.no_grad(), run.allocations:
            model(x.clone())
    finally:
        del model.forward
        for handle in run.handles:
            handle.remove()
    return run.records


def estimated_live_bytes(model: nn.Module, x: torch.Tensor) -> list:
    found = fxprop.estimate(parallel.trace(model), x)
    return [(node.name, node.live_bytes.get("cpu", 0)) for node in found.nodes]


def check_estimate_against_real_run(mesh_1d, mesh_2d) -> None:
    """fxprop.estimate's live bytes after every node equal this rank's real run's."""
    for model, x in ((blocks_and_root_layers(mesh_1d), torch.randn(2, 16)),
                     (fsdp_over_tensor_parallel(mesh_2d), torch.randn(2, 8, 16))):
        estimated = estimated_live_bytes(model, x)
        real = real_live_bytes(model, x)
        assert estimated == real, [(a, b) for a, b in zip(estimated, real) if a != b]


def rank_worker(rank: int, world_size: int, port: int) -> None:
    """One gloo rank: the FSDP models' estimated live bytes against their real run here."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        check_estimate_against_real_run(init_device_mesh("cpu", (world_size,)),
                                        init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp")))
        dist.barrier()
    finally:
        dist.destroy_process_group()
