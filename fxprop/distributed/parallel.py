"""Parallelizing a model for propagation on a (simulated) mesh: a tracer that keeps torch's parallel
styles intact, a tensor-parallel plan for Llama-style decoders, and FSDP's parameter sharding
expressed in DTensor placements.

    mesh = fxprop.simulated_mesh((8, 8), ("dp", "tp"))
    model = fxprop.distributed.parallel.parallelize_llama(llama_on_meta(), mesh)   # TP + SP on tp, FSDP on dp
    gm = fxprop.distributed.parallel.trace(model)
    est = fxprop.estimate(gm, fxprop.TensorSpec((1, 8192), dtype=torch.int64))

Every placement and every collective still comes from DTensor: the plan only chooses torch's
parallel styles, and the FSDP route only states the placement FSDP2 gives each parameter
(``Shard(0)`` on the dp dim) and gathers it with ``DTensor.redistribute`` before its module runs.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch import nn

from .dtensors import is_dtensor
from ..errors import InputError
from ..torch_compat import (dtensor_spec_of, has_forward_hooks, local_tensor_of, own_state,
                           strided_shard)


class ParallelTracer(torch.fx.Tracer):
    """`torch.fx.Tracer` that keeps every module with forward hooks (a parallel style's, FSDP's) as
    a leaf: its hooks then run when fxprop propagates the call, on the values they were written
    for, instead of being traced on proxies."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return has_forward_hooks(m) or super().is_leaf_module(m, module_qualified_name)


def trace(model: nn.Module) -> torch.fx.GraphModule:
    """``model`` traced by `ParallelTracer`, as a GraphModule."""
    graph = ParallelTracer().trace(model)
    return torch.fx.GraphModule(model, graph, type(model).__name__)


def llama_plan(n_layers: int, sequence_parallel: bool = True) -> dict[str, Any]:
    """The tensor-parallel plan (torch's parallel styles) for `fxprop.examples.Llama`, as
    torchtitan parallelizes Llama: attention heads and the FFN's hidden dim split over the mesh
    (q, k, v, w1, w3 column-wise; o and w2 row-wise), the embedding row-wise and the output
    projection column-wise (logits stay sharded on the vocabulary); with ``sequence_parallel``,
    the norms run on sequence shards and the blocks' outputs are reduce-scattered onto them.

    The names are those of `fxprop.examples.Llama`; the heads are split, so the mesh size must
    divide ``n_kv_heads``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    activations = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=activations,
                                          use_local_output=False),
        "output": ColwiseParallel(input_layouts=activations, output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    for layer in range(n_layers):
        prefix = f"layers.{layer}."
        plan.update({
            prefix + "attention": PrepareModuleInput(input_layouts=(activations, Replicate(), Replicate()),
                                                     desired_input_layouts=(Replicate(), Replicate(), Replicate()),
                                                     use_local_output=True),
            prefix + "attention.wq": ColwiseParallel(),
            prefix + "attention.wk": ColwiseParallel(),
            prefix + "attention.wv": ColwiseParallel(),
            prefix + "attention.wo": RowwiseParallel(output_layouts=activations, use_local_output=False),
            prefix + "w1": ColwiseParallel(input_layouts=activations),
            prefix + "w3": ColwiseParallel(input_layouts=activations),
            prefix + "w2": RowwiseParallel(output_layouts=activations, use_local_output=False),
        })
        if sequence_parallel:
            plan[prefix + "attention_norm"] = SequenceParallel()
            plan[prefix + "ffn_norm"] = SequenceParallel()
    return plan


def shard_parameters(model: nn.Module, mesh: Any, dim: str) -> nn.Module:
    """FSDP's parameter sharding, in DTensor placements: every parameter gains ``Shard(0)`` on the
    mesh dim ``dim`` (a DTensor on ``mesh``, whose other dims keep the placements it had on its
    sub-mesh, or ``Replicate()``), which is what ``fully_shard(model, mesh=mesh[dim])`` gives each
    parameter; and every module holding parameters gathers its own before it runs
    (``DTensor.redistribute`` to ``Replicate()`` on ``dim``: DTensor's planner chooses the
    all-gather) and lets them go after, as FSDP2 does with ``reshard_after_forward=True``.

    Unlike FSDP2, the gathers are per module holding parameters, not one per block of them: as
    many bytes, more collectives. No CUDA call is made, so a simulated "cuda" mesh needs no GPU
    (``fully_shard`` itself asks ``torch.cuda.current_device()``; on a "cpu" mesh it propagates as
    it is, see `fxprop.distributed.fsdp`). Returns ``model``, changed."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    names = mesh.mesh_dim_names
    if names is None or dim not in names:
        raise InputError(f"shard_parameters: the mesh has no dim named {dim!r} (its dims: {names})")
    position = names.index(dim)
    others = tuple(name for name in names if name != dim)
    rest = (mesh[others] if len(others) > 1 else mesh[others[0]]) if others else None  # sliced here, not in a hook
    shards: dict[int, tuple[Any, nn.Parameter]] = {}  # by the original (held: its id stays its own); a parameter
    # two modules share (tied weights) is sharded once, and the modules share the shard
    for module in model.modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        module._fxprop_plain = {name for name, parameter in own if not is_dtensor(parameter)}
        for name, parameter in own:
            if id(parameter) not in shards:
                placements = _on_mesh(parameter, mesh, position, Shard(0))
                if is_dtensor(parameter):
                    spec = dtensor_spec_of(parameter)
                    local = local_tensor_of(parameter)
                    sharded = _shard_local(local, spec, mesh, placements)
                else:
                    sharded = distribute_tensor(parameter.detach(), mesh, placements)
                shards[id(parameter)] = parameter, nn.Parameter(sharded, requires_grad=parameter.requires_grad)
            own_state(module)[0][name] = shards[id(parameter)][1]
        module.register_forward_pre_hook(_gather(position, Replicate(), rest))
        module.register_forward_hook(_release)
    return model


def _on_mesh(parameter: Any, mesh: Any, position: int, placement: Any) -> tuple:
    """``placement`` on mesh dim ``position``, the parameter's own placements on the others. Where
    tensor parallelism shards dim 0 too, FSDP2's placement is a strided shard, so that the dp
    gather leaves the tensor-parallel shards alone; so it is here."""
    from torch.distributed.tensor import Replicate, Shard
    placements = [Replicate()] * mesh.ndim
    if is_dtensor(parameter):
        inner = dtensor_spec_of(parameter).mesh
        for inner_dim, inner_placement in zip(inner.mesh_dim_names or (), parameter.placements):
            placements[mesh.mesh_dim_names.index(inner_dim)] = inner_placement
    split = 1
    for dim, other in enumerate(placements):
        if dim != position and isinstance(other, Shard) and other.dim == placement.dim:
            split *= mesh.size(dim)
    placements[position] = strided_shard(placement.dim, split) if split > 1 else placement
    return tuple(placements)


def _shard_local(local: torch.Tensor, spec: Any, mesh: Any, placements: tuple) -> Any:
    """The DTensor on ``mesh`` with ``placements`` of the global shape of ``spec``, cut as
    ``distribute_tensor`` cuts it (its values are not kept: propagation reads none)."""
    from torch.distributed.tensor import distribute_tensor
    shape, stride = tuple(spec.tensor_meta.shape), tuple(spec.tensor_meta.stride)
    return distribute_tensor(torch.empty_strided(shape, stride, dtype=local.dtype, device=local.device), mesh,
                             placements)


def _gather(position: int, replicate: Any, rest: Any):
    def gather(module: nn.Module, args: tuple) -> None:
        saved = {}
        parameters = own_state(module)[0]
        for name, parameter in list(parameters.items()):
            if parameter is None or not is_dtensor(parameter):
                continue
            spec = dtensor_spec_of(parameter)
            mesh = spec.mesh
            placements = list(parameter.placements)
            placements[position] = replicate
            gathered = parameter.redistribute(mesh, placements)
            saved[name] = parameter
            parameters[name] = drop_dim(gathered, None if name in module._fxprop_plain else rest, position)
        module._fxprop_sharded = saved
    return gather


def drop_dim(gathered: Any, rest: Any, position: int) -> Any:
    """A DTensor replicated on mesh dim ``position``, as the DTensor on the other dims, ``rest``
    (FSDP2's unsharded parameter lives on the tensor-parallel mesh alone), or as its local tensor
    where ``rest`` is None. Differentiable: each data-parallel rank's gradient is its own part of
    the sum (``Partial``), which the gather's backward reduce-scatters onto the shards, as FSDP's does."""
    from torch.distributed.tensor import DTensor, Partial
    grad_placements = [Partial() if i == position else p for i, p in enumerate(gathered.placements)]
    local = gathered.to_local(grad_placements=grad_placements)
    if rest is None:
        return local
    placements = tuple(p for i, p in enumerate(gathered.placements) if i != position)
    return DTensor.from_local(local, rest, placements, run_check=False, shape=gathered.shape,
                              stride=gathered.stride())


def _release(module: nn.Module, args: tuple, output: Any) -> None:
    own_state(module)[0].update(getattr(module, "_fxprop_sharded", {}))
    module._fxprop_sharded = {}
