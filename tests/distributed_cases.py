"""Distributed programs compiled with an AOT backend that checks each graph it is handed, shared by
the single-process tests (a simulated mesh) and the multi-process ones (gloo ranks spawned by
torch.multiprocessing, which import this module by name).

Each forward and backward graph is checked twice: when compiled, fxprop's propagation on AOT's
fake inputs against the metadata AOT traced (`compare_with_traced`); when run, fxprop's
propagation on the real inputs against the real execution of the graph on this rank
(`assert_matches_real`), collectives included. Real execution decides where the two disagree:
a node where fxprop differs from AOT's metadata and agrees with the real run is one where torch's
meta kernel is wrong (`TORCH_META_KERNELS_WRONG`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from functorch.compile import aot_module_simplified
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

import fxprop
import fxprop.examples  # noqa: F401
from fxprop.testing import assert_matches_real, compare_with_traced, traced_values


@dataclass
class Checked:
    """What the checking backend saw: each graph's targets, and how many graphs ran for real."""
    graphs: list = field(default_factory=list)  # (forward or backward, the set of call targets)
    ran: int = 0
    inputs: list = field(default_factory=list)  # the type names of each graph's inputs
    meta_kernels_wrong: set = field(default_factory=set)  # the ops where AOT's metadata is not the real run's

    def targets(self) -> set:
        return set().union(*(targets for _, targets in self.graphs))


def checking_backend(checked: Checked, *, dynamic_traced_only: bool = False):
    """An AOT backend whose compilers check each graph against AOT's metadata, then against its
    real execution on the first call."""
    def compiler_for(kind: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs: list):
            checked.inputs.append([type(value).__name__ for value in example_inputs])
            traced = traced_values(gm)
            fxprop.propagate(gm, *example_inputs)
            disagreements = compare_with_traced(gm, traced)
            checked.graphs.append((kind, {node.target for node in gm.graph.nodes if node.op == "call_function"}))
            first = [True]

            def run(args: list):
                if first[0]:
                    first[0] = False
                    assert_matches_real(gm, *args)  # every node, those where AOT's metadata differs included
                    checked.meta_kernels_wrong |= {disagreement.op for disagreement in disagreements}
                    checked.ran += 1
                return gm(*args)
            run._boxed_call = True
            return run
        return compiler

    def backend(gm: torch.fx.GraphModule, example_inputs: list):
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler_for("forward"),
                                     bw_compiler=compiler_for("backward"))
    return backend


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32, norm: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(dim) if norm else nn.Identity()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(self.up(self.norm(x)).relu())


def tensor_parallel(mesh) -> nn.Module:
    return parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def sequence_parallel(mesh) -> nn.Module:
    """LayerNorm on sequence shards, the MLP tensor-parallel between an all-gather and a reduce-scatter."""
    plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}
    return parallelize_module(MLP(norm=True), mesh, plan)


def fsdp_and_tensor_parallel(mesh) -> nn.Module:
    """FSDP2 over ``dp`` (its hooks run eagerly around the compiled graphs) of tensor-parallel blocks
    over ``tp`` (their collectives are in the graphs)."""
    model = nn.Sequential(MLP(norm=True), MLP(norm=True))
    for block in model:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def fully_sharded(mesh) -> nn.Module:
    model = nn.Sequential(MLP(norm=True), MLP(norm=True))
    for block in model:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def collectives(x: torch.Tensor, y: torch.Tensor, group) -> tuple:
    """Every functional collective, on contiguous and transposed inputs, and the in-place
    ``torch.distributed`` calls dynamo rewrites into them."""
    size = dist.get_world_size(group)
    rows = y.shape[0]
    reduced = funcol.all_reduce(x, "sum", group)
    gathered = funcol.all_gather_tensor(x.t(), 0, group)
    gathered_dim1 = funcol.all_gather_tensor(x, 1, group)
    scattered = funcol.reduce_scatter_tensor(y, "sum", 0, group)
    exchanged = funcol.all_to_all_single(y, None, None, group)
    uneven = funcol.all_to_all_single(y, [rows // size] * size, [rows // size] * size, group)
    broadcast = funcol.broadcast(x.t(), 0, group)
    coalesced = funcol.all_reduce_coalesced([x, y.t()], "sum", group)
    gathered_coalesced = funcol.all_gather_into_tensor_coalesced([x, y], group)
    scattered_coalesced = funcol.reduce_scatter_tensor_coalesced([y, y * 2], "max", [0, 0], group)
    in_place = x.clone()
    dist.all_reduce(in_place, group=group)
    into = torch.empty(size * x.shape[0], x.shape[1])
    dist.all_gather_into_tensor(into, x, group=group)
    return (reduced * 2, gathered, gathered_dim1, scattered, exchanged, uneven, broadcast, *coalesced,
            *gathered_coalesced, *scattered_coalesced, in_place, into)


TORCH_META_KERNELS_WRONG = {
    "_c10d_functional.broadcast.default": "empty_like keeps a transposed input's strides; the real op clones "
                                          "it contiguous",
    "_c10d_functional.all_reduce_coalesced.default": "the same, for each input",
    "operator.getitem": "one of all_reduce_coalesced's results",
    "_c10d_functional.wait_tensor.default": "the real op returns its input, here broadcast's contiguous result",
}
"""Where AOT autograd's metadata is torch's meta kernel's mistake: fxprop follows the real op there."""

COLLECTIVE_OPS = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
                  "all_reduce_coalesced", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
                  "wait_tensor"}


def collective_names(targets: set) -> set:
    return {str(target).split(".")[1] for target in targets if str(target).startswith("_c10d_functional.")}


def run_tensor_parallel(mesh, checked: Checked, *, dynamic: bool, train: bool, model_of=tensor_parallel,
                        batch: int = 4) -> None:
    torch.manual_seed(0)  # every rank builds the same model
    model = model_of(mesh)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=checking_backend(checked), dynamic=dynamic)
    x = torch.randn(batch, 8, 16, requires_grad=train)
    with torch.set_grad_enabled(train):
        out = compiled(x)
    if train:
        (out.to_local() if hasattr(out, "to_local") else out).sum().backward()


def run_collectives(group, checked: Checked, *, dynamic: bool, train: bool) -> None:
    torch._dynamo.reset()
    size = dist.get_world_size(group)
    x = torch.randn(4, 6, requires_grad=train)
    y = torch.randn(4 * size, 6)
    compiled = torch.compile(collectives, backend=checking_backend(checked), dynamic=dynamic, fullgraph=True)
    with torch.set_grad_enabled(train):
        outputs = compiled(x, y, group)
    if train:
        outputs[0].sum().backward()


def rank_worker(rank: int, world_size: int, port: int) -> None:
    """One gloo rank: compiles each program, every graph checked against its real execution here."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        checked = Checked()
        run_collectives(dist.group.WORLD, checked, dynamic=False, train=True)
        assert collective_names(checked.targets()) >= COLLECTIVE_OPS, collective_names(checked.targets())
        assert checked.meta_kernels_wrong == set(TORCH_META_KERNELS_WRONG), checked.meta_kernels_wrong
        mesh = init_device_mesh("cpu", (world_size,))
        checked = Checked()
        run_tensor_parallel(mesh, checked, dynamic=False, train=True, model_of=sequence_parallel)
        run_tensor_parallel(mesh, checked, dynamic=True, train=False)
        if world_size == 4:
            run_tensor_parallel(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), checked,
                                dynamic=False, train=True, model_of=fsdp_and_tensor_parallel)
            check_dtensor_values_against_real_ranks(mesh)
            check_estimate_against_real_ranks(mesh)
        assert checked.ran == len(checked.graphs) > 0, (checked.ran, len(checked.graphs))
        assert checked.meta_kernels_wrong <= set(TORCH_META_KERNELS_WRONG), checked.meta_kernels_wrong
        dist.barrier()
    finally:
        dist.destroy_process_group()


def check_dtensor_values_against_real_ranks(mesh) -> None:
    """On real gloo ranks: each module's placements and local shapes, and the collectives by kind,
    that fxprop propagates for a DTensor module are the ones its real run on this rank has (a
    tensor-parallel MLP, and a Llama-style decoder with tensor and sequence parallelism)."""
    from fxprop.distributed import parallel
    torch.manual_seed(0)
    programs = ((lambda: tensor_parallel(mesh), torch.randn(4, 16)),
                (lambda: tiny_llama(mesh, fsdp=False, device="cpu"), torch.randint(0, 256, (2, 16))))
    for make, tokens in programs:
        model = make()
        expected_outputs, expected_counts = eager_reference(model, tokens)
        gm = parallel.trace(model)
        fxprop.propagate(gm, tokens)
        outputs, counts = propagated(gm)
        assert outputs == {name: expected_outputs[name] for name in outputs}, (outputs, expected_outputs)
        assert counts == expected_counts, (counts, expected_counts)


def _local_storages(value) -> dict:
    """The storages a value holds on this rank: a DTensor's are its local shard's."""
    from torch.distributed.tensor import DTensor
    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor) and hasattr(value, "trigger_wait"):  # a collective's result, not waited yet
        value = value.trigger_wait()
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        return {(storage.data_ptr() if storage.nbytes() else id(storage)): storage.nbytes()}
    found: dict = {}
    for item in (value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()):
        found.update(_local_storages(item))
    return found


class LiveLocalBytes(torch.fx.Interpreter):
    """Real execution on this rank: the bytes of local storages live just after each node, values
    freed after their last use (as `fxprop.estimate`'s model has it)."""

    def __init__(self, gm):
        super().__init__(gm, garbage_collect_values=True)
        self.held: dict = {}
        for node in gm.graph.nodes:
            if node.op == "call_module":
                module = self.fetch_attr(node.target)
                self.held.update(_local_storages([*module.parameters(), *module.buffers()]))
            elif node.op == "get_attr":
                self.held.update(_local_storages(self.fetch_attr(node.target)))
        self.records: list = []

    def run(self, *args):
        self.held.update(_local_storages(list(args)))
        return super().run(*args)

    def run_node(self, node):
        result = super().run_node(node)
        live = dict(self.held)
        for value in [*self.env.values(), result]:
            live.update(_local_storages(value))
        self.records.append((node.name, sum(live.values())))
        return result


def check_estimate_against_real_ranks(mesh) -> None:
    """On real gloo ranks: `fxprop.estimate`'s live bytes after every node of a DTensor module are
    this rank's live local storages in its real run (a tensor-parallel MLP, a TP+SP decoder)."""
    from fxprop.distributed import parallel
    torch.manual_seed(0)
    programs = ((lambda: tensor_parallel(mesh), torch.randn(4, 16)),
                (lambda: tiny_llama(mesh, fsdp=False, device="cpu"), torch.randint(0, 256, (2, 16))))
    for make, tokens in programs:
        model = make()
        gm = parallel.trace(model)
        found = fxprop.estimate(gm, tokens)
        run = LiveLocalBytes(parallel.trace(model))
        with torch.no_grad():
            run.run(tokens.clone())
        got = [(node.name, node.live_bytes.get("cpu", 0)) for node in found.nodes]
        assert got == run.records, [(a, b) for a, b in zip(got, run.records) if a != b][:8]


# --- DTensor values through a graph: the eager reference ------------------------------------

def describe(value):
    """A module's output as the reference and fxprop's annotation are compared: a DTensor by its
    placements, local shape and global shape; a tensor by its shape; tuples item by item."""
    from torch.distributed.tensor import DTensor
    if isinstance(value, DTensor):
        return ("DTensor", tuple(value.placements), tuple(value.to_local().shape), tuple(value.shape))
    if isinstance(value, torch.Tensor):
        return ("Tensor", tuple(value.shape))
    if isinstance(value, (tuple, list)):
        return tuple(describe(item) for item in value)
    return type(value).__name__


def eager_reference(model: nn.Module, *inputs) -> tuple[dict, dict]:
    """The model run eagerly (meta DTensors on a simulated mesh, or real ones on gloo) under
    CommDebugMode: each submodule's output described, and the collectives counted by kind."""
    from torch.distributed.tensor.debug import CommDebugMode
    outputs: dict = {}
    handles = [module.register_forward_hook(lambda _, args, out, name=name: outputs.__setitem__(name, describe(out)))
               for name, module in model.named_modules()]
    try:
        with CommDebugMode() as comm, torch.no_grad():
            outputs[""] = describe(model(*inputs))
    finally:
        for handle in handles:
            handle.remove()
    return outputs, {str(op).split(".")[-1]: count for op, count in comm.get_comm_counts().items()}


def propagated(gm: torch.fx.GraphModule) -> tuple[dict, dict]:
    """The same, read from fxprop's annotations: each call_module node's value, the graph's output,
    and the collectives its nodes recorded."""
    outputs = {str(node.target): describe(node.meta["val"]) for node in gm.graph.nodes if node.op == "call_module"}
    output = gm.graph.find_nodes(op="output")[0]
    value = output.meta["val"]
    outputs[""] = describe(value[0] if isinstance(value, tuple) and len(value) == 1 else value)
    counts: dict = {}
    for node in gm.graph.nodes:
        sharding = node.meta.get("fxprop_dtensor")
        for collective in (sharding.collectives if sharding is not None else ()):
            counts[collective.kind] = counts.get(collective.kind, 0) + 1
    return outputs, counts


def tiny_llama_config():
    return fxprop.examples.LlamaConfig(vocab_size=256, dim=64, n_layers=2, n_heads=8, n_kv_heads=4, ffn_dim=128)


def tiny_llama(mesh, *, fsdp: bool, sequence_parallel: bool = True, device: str = "meta") -> nn.Module:
    """The Llama-style decoder parallelized with `fxprop.distributed.parallel.llama_plan` on ``mesh["tp"]``
    and, with ``fsdp``, its parameters sharded on ``mesh["dp"]`` (`fxprop.distributed.parallel.shard_parameters`)."""
    from fxprop.distributed import parallel
    config = tiny_llama_config()
    torch.manual_seed(0)
    with torch.device(device):
        model = fxprop.examples.Llama(config)
    tp = mesh["tp"] if mesh.ndim > 1 else mesh
    model = parallelize_module(model, tp, parallel.llama_plan(config.n_layers, sequence_parallel))
    if fsdp:
        parallel.shard_parameters(model, mesh, "dp")
    return model
