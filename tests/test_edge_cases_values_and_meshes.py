"""Adversary findings (round 2): known values through ops, DTensor values, and their refusals.

Each test compares fxprop with real execution (or torch's own eager DTensor on meta), so it
passes once the finding is fixed."""
from __future__ import annotations

import pytest
import torch
from torch.fx import symbolic_trace

import fxprop
from test_trust import peak_growth_kib


def _real(gm, *inputs):
    """Real execution of ``gm`` on copies of ``inputs``: its result, or the exception it raises."""
    try:
        return gm(*[i.clone() if isinstance(i, torch.Tensor) else i for i in inputs])
    except Exception as error:  # noqa: BLE001 - the reference's refusal is the answer
        return error


# --- known values: the host copy is compact, a view's storage is not ----------------------------

@pytest.mark.parametrize("fn, value", [
    (lambda n: n[::2].as_strided((2,), (1,)).tolist(), torch.tensor([10, 11, 12, 13, 14, 15])),
    (lambda n: n[2:].as_strided((2,), (1,), 0).tolist(), torch.tensor([10, 11, 12, 13, 14, 15])),
    (lambda n: n.as_strided((3,), (1,)).tolist(), torch.arange(6)[::2]),
], ids=["strided-view", "offset-view", "strided-user-input"])
def test_as_strided_of_known_values_is_never_the_host_copys_elements(fn, value):
    """Finding: value flow re-ran ``as_strided`` on a compact host copy of the known view, whose
    storage holds other elements than the view's storage: ``.tolist()`` gave [10, 12] where real
    execution gives [10, 11]. Now those results are values fxprop does not know (symbols)."""
    gm = symbolic_trace(fn)
    got = fxprop.propagate(gm, value)
    real = gm(value)
    assert all(isinstance(g, torch.SymInt) or g == r for g, r in zip(got, real)), (got, real)


def test_value_flow_never_makes_a_large_sibling_of_a_small_known_result():
    """Finding: value flow re-ran an op on the host when any one of its results was small enough
    to keep: ``qr(x, mode="complete")`` of a known (8192, 1) tensor made the (8192, 8192) Q on the
    host (256 MiB, past ``fallback_limit_bytes=1 MiB``) to learn the (8192, 1) R; at 65,536 rows,
    16 GiB. In a fresh process, whose peak memory is its own (about 90 MiB without the host run)."""
    grew = peak_growth_kib("gm = torch.fx.symbolic_trace(lambda k: torch.linalg.qr((torch.arange(8192) + k).float()"
                           ".unsqueeze(1), mode='complete')[1])",
                           "out = fxprop.propagate(gm, torch.tensor(1), fallback_limit_bytes=1 << 20)\n"
                           "assert out.shape == (8192, 1)")
    assert grew < 192 * 1024, f"grew by {grew} KiB"


# --- known values out of range: real execution refuses ------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda x, i: x.index_put_((i,), torch.tensor(1.0)),
    lambda x, i: torch.gather(x, 0, i),
    lambda x, i: torch.scatter(x, 0, i, 1.0),
    lambda x, i: torch.index_add(x, 0, i, torch.ones(1)),
    lambda x, i: x.index_copy(0, i, torch.ones(1)),
    lambda x, i: x.index_fill(0, i, 1.0),
    lambda x, i: torch.take(x, i),
], ids=["index_put_", "gather", "scatter", "index_add", "index_copy", "index_fill", "take"])
def test_known_out_of_range_indices_are_refused_like_the_cpu_kernel(fn):
    """Finding: with a real index tensor the user passed (its values known), embedding,
    index_select and ``x[i]`` refuse an index out of range as the CPU kernel does, but these ops
    accepted index 5 into a dim of size 3 and answered a shape."""
    gm = symbolic_trace(fn)
    inputs = (torch.zeros(3), torch.tensor([5]))
    real = _real(gm, *inputs)
    assert isinstance(real, Exception)
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, *inputs)
    assert issubclass(caught.value.error_type, type(real))


def test_integer_division_by_a_known_zero_is_refused_like_the_cpu_kernel():
    """Finding: ``x // (x - 1)`` with x = [1, 2, 3] raises RuntimeError("ZeroDivisionError") on the
    CPU; fxprop knew every value and answered [u0, u1, u2]."""
    gm = symbolic_trace(lambda x: (x // (x - 1)).tolist())
    real = _real(gm, torch.tensor([1, 2, 3]))
    assert isinstance(real, RuntimeError)
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, torch.tensor([1, 2, 3]))
    assert issubclass(caught.value.error_type, RuntimeError)


# --- a data-dependent length is fxprop's limit, not the model's error ---------------------------

@pytest.mark.parametrize("fn", [lambda x: torch.unique(x).tolist(), lambda x: (x - 2).nonzero().tolist(),
                                lambda x: x[x > 1].tolist()], ids=["unique", "nonzero", "masked"])
def test_tolist_of_a_data_dependent_length_is_a_data_dependent_error(fn):
    """Finding: real execution returns a list; fxprop raised PropagationError with error_type
    RuntimeError ("tolist(): a tensor of symbolic shape (u0,) has no fixed number of values"),
    a refusal blamed on the model where the docs promise DataDependentError."""
    gm = symbolic_trace(fn)
    assert isinstance(gm(torch.tensor([1, 2, 3])), list)
    with pytest.raises(fxprop.DataDependentError):
        fxprop.propagate(gm, torch.tensor([1, 2, 3]))


# --- DTensor specs ------------------------------------------------------------------------------

@pytest.fixture
def mesh():
    pytest.importorskip("torch.distributed.tensor")
    with fxprop.mesh_simulation((2, 2), ("dp", "tp")) as made:
        yield made


def test_a_negative_shard_dim_is_normalized_as_dtensor_does(mesh):
    """Finding: ``Shard(-1)`` is a placement torch accepts (``DTensor.from_local`` normalizes it to
    ``Shard(1)``); ``TensorSpec(..., placements=(Shard(-1), Replicate()))`` failed with a bare
    AssertionError ("must be normalized")."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    eager = DTensor.from_local(torch.empty(4, 2, device="meta"), mesh, (Replicate(), Shard(-1)), run_check=False)
    out = fxprop.propagate(symbolic_trace(lambda x: x * 2),
                           fxprop.TensorSpec((4, 4), mesh=mesh, placements=(Replicate(), Shard(-1))))
    assert tuple(out.placements) == tuple(eager.placements)
    assert tuple(out.to_local().shape) == tuple(eager.to_local().shape)


def test_misused_dtensor_specs_are_input_errors(mesh):
    """Finding: bad ``placements`` gave a bare IndexError (a shard dim out of range, a 0-dim
    tensor sharded), TypeError (one placement, not a sequence), AttributeError (a mesh that is
    not a DeviceMesh), or a PropagationError blaming the model's first op (strings or None as
    placements); the docs promise InputErrors naming the argument."""
    from torch.distributed.tensor import Replicate, Shard
    gm = symbolic_trace(lambda x: x * 2)
    bad = [dict(shape=(4, 4), mesh=mesh, placements=(Shard(2), Replicate())),
           dict(shape=(), mesh=mesh, placements=(Shard(0), Replicate())),
           dict(shape=(4, 4), mesh=mesh["tp"], placements=Shard(0)),
           dict(shape=(4, 4), mesh=(2, 2), placements=(Shard(0), Replicate())),
           dict(shape=(4, 4), mesh=mesh, placements=("S", "R")),
           dict(shape=(4, 4), mesh=mesh, placements=(None, None))]
    for kwargs in bad:
        with pytest.raises(fxprop.InputError):
            fxprop.propagate(gm, fxprop.TensorSpec(**kwargs))


def test_floor_division_of_a_sharded_integer_dtensor_matches_eager_dtensor(mesh):
    """Finding: ``a // 2`` of an int64 DTensor sharded on dim 0 runs eagerly on meta DTensors
    (placements kept: Shard(0)), but fxprop refused it: PropagationError, error_type
    NotImplementedError ("aten.floor_divide.default does not have a sharding strategy"), in a process
    where eager DTensor had not yet run ``floor_divide`` (after an eager call, fxprop's succeeds).
    Cause: DTensor's decomposition strategy builds its fake mesh lazily, ``DeviceMesh(device_type,
    [0])``, and under fxprop's ambient ``torch.device("meta")`` that mesh's rank map is a meta
    tensor: ``tolist()`` fails, and DTensor reports the op as having no sharding strategy."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    placements = (Replicate(), Shard(0))
    # fxprop first: once eager DTensor has run the op in this process, fxprop's call succeeds too
    out = fxprop.propagate(symbolic_trace(lambda a: a // 2),
                           fxprop.TensorSpec((4, 4), dtype=torch.int64, mesh=mesh, placements=placements))
    eager = DTensor.from_local(torch.empty(2, 4, dtype=torch.int64, device="meta"), mesh, placements,
                               run_check=False) // 2
    assert tuple(out.placements) == tuple(eager.placements)
    assert tuple(out.to_local().shape) == tuple(eager.to_local().shape)


def test_an_op_dtensor_cannot_shard_is_unsupported_not_the_models_error(mesh):
    """Finding: the docs say an op DTensor has no sharding strategy for is refused as
    UnsupportedError; ``x.nonzero()`` on a DTensor gave PropagationError with error_type
    NotImplementedError (eager DTensor raises RuntimeError), blaming the model."""
    from torch.distributed.tensor import Replicate
    gm = symbolic_trace(lambda a: a.nonzero())
    with pytest.raises(fxprop.UnsupportedError):
        fxprop.propagate(gm, fxprop.TensorSpec((4, 4), mesh=mesh, placements=(Replicate(), Replicate())))


def test_repropagate_of_a_dtensor_graph_equals_a_full_propagate(mesh):
    """Finding: after an edit, ``repropagate`` re-annotated the edited node and the output with
    plain FakeTensors of the global shape (no placements, no ``fxprop_dtensor``), where a full
    ``propagate`` of the edited graph, and eager DTensor, give DTensors sharded as the input."""
    import operator

    from torch.distributed.tensor import DTensor, Replicate, Shard
    placements = (Replicate(), Shard(0))
    gm = symbolic_trace(lambda a: torch.relu(a) + 1)
    fxprop.propagate(gm, fxprop.TensorSpec((6, 8), mesh=mesh, placements=placements))
    add = next(node for node in gm.graph.nodes if node.target is operator.add)
    add.args = (add.args[0], 2)
    gm.recompile()
    fxprop.repropagate(gm, [add])
    full = fxprop.propagate(symbolic_trace(lambda a: torch.relu(a) + 2),
                            fxprop.TensorSpec((6, 8), mesh=mesh, placements=placements))
    eager = gm(DTensor.from_local(torch.empty(3, 8, device="meta"), mesh, placements, run_check=False))
    annotated = add.meta["val"]
    assert isinstance(annotated, DTensor) and isinstance(full, DTensor)
    assert tuple(annotated.placements) == tuple(full.placements) == tuple(eager.placements)
    assert tuple(annotated.to_local().shape) == tuple(full.to_local().shape) == tuple(eager.to_local().shape)


# --- fxprop estimate: a setting torch or transformers refuses is a usage error ------------------

TINY_LLAMA = ("hidden_size=32", "intermediate_size=64", "num_hidden_layers=2", "num_attention_heads=4",
              "num_key_value_heads=2", "vocab_size=128", "max_position_embeddings=64")


@pytest.mark.parametrize("extra", [("hidden_size=30",), ("hidden_size=True",),
                                   ("--train", "--optimizer", "sgd", "--momentum", "-1")],
                         ids=["heads-do-not-divide", "bool-size", "negative-momentum"])
def test_estimate_refuses_settings_transformers_or_torch_refuse_without_a_traceback(extra):
    """Finding: transformers' config validation (huggingface_hub's StrictDataclassError: a hidden
    size the heads do not divide, a bool for an int) and torch.optim.SGD's ValueError for a
    negative momentum escaped ``fxprop estimate`` as Python tracebacks (exit code 1), where other
    refused settings are one-line usage errors (exit code 2). Constructing the config or the
    optimizer directly raises, as the command should refuse."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    overrides = tuple(item for item in extra if "=" in item)
    options = tuple(item for item in extra if "=" not in item)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "fxprop", "estimate", "llama", *TINY_LLAMA, *overrides, "--seq", "8",
                           "--progress", "never", *options], cwd=root, env=env, capture_output=True, text=True,
                          timeout=180)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr


# --- tensor_split by a tensor: read on the host ------------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda x: torch.tensor_split(x, torch.arange(4)[1:3]),
    lambda x: torch.tensor_split(x, torch.tensor([1, 5]), dim=1),
    lambda x: x.tensor_split(torch.tensor(3), 1),
    lambda x: torch.tensor_split(x, tensor_indices_or_sections=torch.tensor([0, 2])),
    lambda x: torch.tensor_split(x, 3, dim=1),
    lambda x: x.tensor_split([1, 2]),
    lambda x: torch.tensor_split(x, torch.tensor([1.0, 2.0])),
    lambda x: torch.tensor_split(x, torch.tensor([[1, 2]])),
], ids=["arange-slice", "constant-dim1", "sections-method", "keyword", "int", "list", "float", "2-d"])
def test_tensor_split_by_a_tensor_of_known_values_is_answered_as_real_execution(fn):
    """Finding: indices given as a tensor reached torch's kernel as a meta tensor, which it refused
    ("expected ... to be on cpu"), where real execution splits; fxprop knows the values of a tensor
    built from constants."""
    gm = symbolic_trace(fn)
    x = torch.randn(4, 6)
    real = _real(gm, x)
    if isinstance(real, Exception):
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, fxprop.TensorSpec((4, 6)), cache=False)
        assert caught.value.error_type is type(real)
        return
    out = fxprop.propagate(gm, fxprop.TensorSpec((4, 6), device="cuda"), cache=False)
    assert [(t.shape, t.stride(), t.storage_offset()) for t in out] == [
        (t.shape, t.stride(), t.storage_offset()) for t in real]
    assert all(t.device == torch.device("cuda:0") for t in out)


def test_tensor_split_by_a_tensor_of_unknown_values_or_not_on_the_cpu():
    by_data = symbolic_trace(lambda x: torch.tensor_split(x, x[0].argsort()[:2]))
    with pytest.raises(fxprop.DataDependentError, match="tensor_split"):
        fxprop.propagate(by_data, fxprop.TensorSpec((4, 6)))
    on_meta = symbolic_trace(lambda x, at: torch.tensor_split(x, at))
    real = _real(on_meta, torch.randn(4, 6), torch.tensor([1], device="meta"))
    assert isinstance(real, RuntimeError)
    with pytest.raises(fxprop.PropagationError, match="to be on cpu") as caught:
        fxprop.propagate(on_meta, torch.randn(4, 6), torch.tensor([1], device="meta"))
    assert caught.value.error_type is RuntimeError
