"""``fxprop estimate ... --mesh dp=2,tp=4``: a transformers causal LM parallelized as transformers does it, on a
simulated mesh.

The ``tp`` mesh dim takes the model's own tensor-parallel plan (its class's ``_tp_plan`` and its
config's ``base_model_tp_plan``), resolved and applied by transformers' own code
(``_resolve_parallel_plans`` and ``apply_tensor_parallelism``, what ``from_pretrained`` runs for a
``DistributedConfig(tp_size=...)``). The ``dp`` mesh dim shards every parameter as FSDP does
(`fxprop.distributed.parallel.shard_parameters`), and so the gradients and the optimizer's state.
The rank's step is then traced on its local tensors (`fxprop.estimate.traced_step`).
"""
from __future__ import annotations

from typing import Any

import torch

from ..distributed.dtensors import is_dtensor
from ..torch_compat import transformers_tp_plan
from .loading import UsageError
from .meshes import check_rank

MESH_DIMS = ("dp", "tp")


def check_mesh(shape: tuple[int, ...], names: tuple[str, ...], rank: int) -> None:
    """The mesh dims this command knows, and a rank the mesh has."""
    unknown = [name for name in names if name not in MESH_DIMS]
    if unknown:
        raise UsageError(f"--mesh: unknown mesh dim {', '.join(map(repr, unknown))}: fxprop estimate shards on dp "
                         "(parameters, gradients and optimizer state, as FSDP) and tp (the model's tensor-parallel "
                         "plan), e.g. --mesh dp=2,tp=4")
    check_rank(rank, shape)


def check_tensor_parallel(model: Any, tp_size: int) -> None:
    """A plan to shard with, and attention heads that ``tp_size`` divides (each rank computes whole heads)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(model, "tp_plan", None):
        raise UsageError(f"--mesh tp={tp_size}: {type(model).__name__} ({config.model_type}) has no tensor-parallel "
                         "plan in transformers (no base_model_tp_plan in its config, no _tp_plan)")
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % tp_size:
            raise UsageError(f"--mesh tp={tp_size}: the tensor-parallel plan splits attention heads over the tp "
                             f"ranks, and {field}={heads} is not a multiple of {tp_size}")


def parallelize(model: Any, mesh: Any) -> Any:
    """``model`` (on the meta device) parallelized on ``mesh``, in place: tp as transformers does it, then dp."""
    from ..distributed.parallel import shard_parameters
    names = mesh.mesh_dim_names
    if "tp" in names and mesh["tp"].size() > 1:
        check_tensor_parallel(model, mesh["tp"].size())
        _tensor_parallel(model, mesh["tp"])
    if "dp" in names and mesh["dp"].size() > 1:
        shard_parameters(model, mesh, "dp")
    return model


def _tensor_parallel(model: Any, tp_mesh: Any) -> None:
    """transformers' plan applied as ``from_pretrained`` applies it: on the model with its tied
    weights untied (it builds the model under ``no_tie_weights``), tied again afterwards (its
    ``tie_weights``: the tied name gets the sharded parameter of the name it is tied to). The plan
    names each tied parameter, which ``named_parameters`` lists once."""
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism
    tied = _untie(model)
    apply_tensor_parallelism(model, tp_mesh, transformers_tp_plan(model, tp_mesh.size()))
    for (owner, name), (source_owner, source_name) in tied:
        source = getattr(source_owner, source_name)
        untied = getattr(owner, name)
        if is_dtensor(source) != is_dtensor(untied) or (
                is_dtensor(source) and tuple(source.placements) != tuple(untied.placements)):
            raise UsageError(f"--mesh tp={tp_mesh.size()}: {type(model).__name__}'s tensor-parallel plan shards "
                             f"tied weights differently ({_placements(source)} and {_placements(untied)})")
        setattr(owner, name, source)


def _untie(model: Any) -> list[tuple[tuple[Any, str], tuple[Any, str]]]:
    """Give every parameter that repeats one listed before it (a tied weight) a copy of its own;
    returns ((module, name), (module, name) of the one it repeats) for each."""
    modules = dict(model.named_modules(remove_duplicate=False))
    first: dict[int, tuple[Any, str]] = {}
    tied = []
    for qualified, parameter in model.named_parameters(remove_duplicate=False):
        owner_name, _, name = qualified.rpartition(".")
        owner = modules[owner_name]
        if id(parameter) in first:
            if (owner, name) != first[id(parameter)]:
                tied.append(((owner, name), first[id(parameter)]))
        else:
            first[id(parameter)] = (owner, name)
    for (owner, name), _ in tied:
        parameter = getattr(owner, name)
        setattr(owner, name, torch.nn.Parameter(parameter.detach().clone(), requires_grad=parameter.requires_grad))
    return tied


def _placements(value: Any) -> str:
    return str(tuple(value.placements)) if is_dtensor(value) else "whole"


def check_optimizer(name: str, model: Any) -> None:
    """An optimizer torch can step on the parallelized model's DTensor parameters: Adafactor cannot
    (its parameter norm is a partial DTensor, which its in-place ``pow_`` refuses), so a step of it
    would be no step a rank can run."""
    if name == "adafactor" and any(is_dtensor(p) for p in model.parameters()):
        raise UsageError("--optimizer adafactor with --mesh: torch.optim.Adafactor cannot step DTensor parameters "
                         "(DTensor refuses the in-place pow_ on its parameter norm's partial placement); use adamw or sgd")


def parameter_groups(parameters: list[torch.nn.Parameter]) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: the DTensors, and the plain tensors a plan left alone (a norm's
    weight under tensor parallelism). torch's foreach kernels refuse a list that mixes both, and
    one group runs one foreach call."""
    groups = [{"params": [p for p in parameters if is_dtensor(p)]},
              {"params": [p for p in parameters if not is_dtensor(p)]}]
    return [group for group in groups if group["params"]]
