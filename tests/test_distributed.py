"""Graphs of distributed programs (DTensor plans, FSDP2, functional collectives) and simulated meshes.

Every graph is checked against AOT autograd's own metadata and against its real execution: in
one process on a simulated mesh (torch's fake process group runs the real collective kernels,
moving no data), and on 2 and 4 gloo ranks (``-m distributed`` selects those).
"""
import contextlib
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import fxprop
from fxprop.testing import check_rule

import distributed_cases as cases
from distributed_cases import Checked

c10d = torch.ops._c10d_functional


@contextlib.contextmanager
def simulated(shape, names=None):
    """A simulated CPU mesh, so that each graph also runs for real here."""
    with fxprop.mesh_simulation(shape, names, device_type="cpu") as mesh:
        yield mesh


# --- graphs torch.compile hands a backend ------------------------------------------------

@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_tensor_parallel_mlp_on_eight_ranks(dynamic):
    """The issue's program: Colwise up, Rowwise down; its graphs take the DeviceMesh as an opaque
    input. (Training under dynamic=True is refused by torch's own AOT autograd: inference then.)"""
    checked = Checked()
    with simulated((8,)) as mesh:
        cases.run_tensor_parallel(mesh, checked, dynamic=dynamic, train=not dynamic)
    assert [kind for kind, _ in checked.graphs] == (["forward"] if dynamic else ["forward", "backward"])
    assert checked.ran == len(checked.graphs) and not checked.meta_kernels_wrong
    assert "FakeScriptObject" in checked.inputs[0]
    assert {"all_reduce", "wait_tensor"} <= cases.collective_names(checked.targets())


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_sequence_parallel(dynamic):
    checked = Checked()
    with simulated((4,)) as mesh:
        cases.run_tensor_parallel(mesh, checked, dynamic=dynamic, train=not dynamic, model_of=cases.sequence_parallel)
    assert checked.ran == len(checked.graphs) >= 1 and not checked.meta_kernels_wrong
    assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= cases.collective_names(checked.targets())


def test_fully_shard_with_tensor_parallel_blocks():
    checked = Checked()
    with simulated((2, 2), ("dp", "tp")) as mesh:
        cases.run_tensor_parallel(mesh, checked, dynamic=False, train=True, model_of=cases.fsdp_and_tensor_parallel)
    assert checked.ran == len(checked.graphs) >= 4 and not checked.meta_kernels_wrong


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_fully_shard(dynamic):
    checked = Checked()
    with simulated((4,)) as mesh:
        cases.run_tensor_parallel(mesh, checked, dynamic=dynamic, train=True, model_of=cases.fully_sharded)
    assert checked.ran == len(checked.graphs) >= 2 and not checked.meta_kernels_wrong


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_functional_collectives(dynamic):
    checked = Checked()
    with simulated((4,)):
        cases.run_collectives(dist.group.WORLD, checked, dynamic=dynamic, train=True)
    assert checked.ran == len(checked.graphs) == 2
    assert cases.collective_names(checked.targets()) >= cases.COLLECTIVE_OPS
    assert checked.meta_kernels_wrong == set(cases.TORCH_META_KERNELS_WRONG)  # fxprop follows the real ops there


def test_a_dtensor_parameter_of_a_traced_module_propagates():
    """Once refused; now DTensor's own sharding propagation (tests/test_dtensors.py checks it against eager)."""
    with simulated((4,)) as mesh:
        gm = torch.fx.symbolic_trace(cases.tensor_parallel(mesh))
        out = fxprop.propagate(gm, torch.randn(2, 16))
    assert tuple(out.shape) == (2, 16)
    assert [c.kind for n in gm.graph.nodes if "fxprop_dtensor" in n.meta
            for c in n.meta["fxprop_dtensor"].collectives] == ["all_reduce"]


# --- each collective against the real op ---------------------------------------------------

def _strided(rows, columns):
    return torch.randn(rows, 2 * columns)[:, ::2]


COLLECTIVES = [  # (id, op, a function of the group's name giving the arguments)
    ("all_reduce", c10d.all_reduce.default, lambda x, g: (x, "sum", g)),
    ("all_reduce_transposed", c10d.all_reduce.default, lambda x, g: (x.t(), "avg", g)),
    ("all_reduce_", c10d.all_reduce_.default, lambda x, g: (x.t(), "max", g)),
    ("all_reduce_strided_", c10d.all_reduce_.default, lambda x, g: (_strided(8, 6), "sum", g)),
    ("all_reduce_coalesced", c10d.all_reduce_coalesced.default, lambda x, g: ([x, x.t(), _strided(8, 6)], "sum", g)),
    ("all_reduce_coalesced_", c10d.all_reduce_coalesced_.default, lambda x, g: ([x, x.t()], "min", g)),
    ("broadcast", c10d.broadcast.default, lambda x, g: (x, 1, g)),
    ("broadcast_transposed", c10d.broadcast.default, lambda x, g: (x.t(), 0, g)),
    ("broadcast_", c10d.broadcast_.default, lambda x, g: (x.t(), 0, g)),
    ("all_gather", c10d.all_gather_into_tensor.default, lambda x, g: (x.t(), 4, g)),
    ("all_gather_0dim", c10d.all_gather_into_tensor.default, lambda x, g: (x[0, 0], 4, g)),
    ("all_gather_coalesced", c10d.all_gather_into_tensor_coalesced.default, lambda x, g: ([x, x.t()], 4, g)),
    ("reduce_scatter", c10d.reduce_scatter_tensor.default, lambda x, g: (x, "sum", 4, g)),
    ("reduce_scatter_transposed", c10d.reduce_scatter_tensor.default, lambda x, g: (x.t().contiguous().t(), "sum", 4, g)),
    ("reduce_scatter_coalesced", c10d.reduce_scatter_tensor_coalesced.default, lambda x, g: ([x, x * 2], "avg", 4, g)),
    ("all_to_all", c10d.all_to_all_single.default, lambda x, g: (x, [2, 2, 2, 2], [2, 2, 2, 2], g)),
    ("all_to_all_uneven", c10d.all_to_all_single.default, lambda x, g: (x, [1, 3, 2, 2], [2, 2, 2, 2], g)),
    ("shard_dim_alltoall", torch.ops._dtensor.shard_dim_alltoall.default, lambda x, g: (x.t(), 0, 1, g)),
    ("wait", c10d.wait_tensor.default, lambda x, g: (x.t(),)),
    ("wait_strided", c10d.wait_tensor.default, lambda x, g: (_strided(8, 6),)),
]
OUT_COLLECTIVES = [  # (id, op, arguments, out)
    ("all_gather_out", c10d.all_gather_into_tensor_out.default, lambda x, g: (x, 4, g), lambda: torch.empty(32, 6)),
    ("all_gather_out_transposed", c10d.all_gather_into_tensor_out.default, lambda x, g: (x, 4, g),
     lambda: torch.empty(6, 32).t()),
    ("reduce_scatter_out_transposed", c10d.reduce_scatter_tensor_out.default, lambda x, g: (x, "sum", 4, g),
     lambda: torch.empty(6, 2).t()),
]
REFUSED = [  # (id, op, arguments, out): every process group refuses these (gloo's run agrees)
    ("reduce_op", c10d.all_reduce.default, lambda x, g: (x, "SUM", g), None),
    ("reduce_op_coalesced", c10d.all_reduce_coalesced.default, lambda x, g: ([x], "premul_sum", g), None),
    ("reduce_scatter_indivisible", c10d.reduce_scatter_tensor.default, lambda x, g: (x[:7], "sum", 4, g), None),
    ("reduce_scatter_coalesced_indivisible", c10d.reduce_scatter_tensor_coalesced.default,
     lambda x, g: ([x, x.t()], "sum", 4, g), None),
    ("all_to_all_splits", c10d.all_to_all_single.default, lambda x, g: (x, [2, 2, 2, 2], [1, 2, 2, 2], g), None),
    ("all_gather_out_size", c10d.all_gather_into_tensor_out.default, lambda x, g: (x, 4, g),
     lambda: torch.empty(30, 6)),
    ("reduce_scatter_out_size", c10d.reduce_scatter_tensor_out.default, lambda x, g: (x, "sum", 4, g),
     lambda: torch.empty(3, 6)),
]


@pytest.mark.parametrize("op,arguments", [case[1:] for case in COLLECTIVES], ids=[case[0] for case in COLLECTIVES])
def test_each_collective_matches_the_real_op(op, arguments):
    with simulated((4,)):
        check_rule(op, *arguments(torch.randn(8, 6), dist.group.WORLD.group_name))


@pytest.mark.parametrize("op,arguments,out", [case[1:] for case in OUT_COLLECTIVES],
                         ids=[case[0] for case in OUT_COLLECTIVES])
def test_an_out_collective_returns_out_as_the_real_op_does(op, arguments, out):
    with simulated((4,)):
        check_rule(op, *arguments(torch.randn(8, 6), dist.group.WORLD.group_name), out=out())


@pytest.mark.parametrize("op,arguments,out", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_a_collective_is_refused_where_the_real_op_refuses(op, arguments, out):
    with simulated((4,)):
        kwargs = {"out": out()} if out is not None else {}
        with pytest.raises(fxprop.PropagationError):
            check_rule(op, *arguments(torch.randn(8, 6), dist.group.WORLD.group_name), **kwargs)


def test_an_out_of_another_shape_but_as_many_elements_depends_on_the_backend():
    gm, _ = fxprop.testing.call_graph(c10d.all_gather_into_tensor_out.default,
                                      (fxprop.TensorSpec((8, 6)), 4, "0"), {"out": fxprop.TensorSpec((4, 8, 6))})
    with pytest.raises(fxprop.UnsupportedError, match="depends on its backend"):
        fxprop.propagate(gm, fxprop.TensorSpec((8, 6)), fxprop.TensorSpec((4, 8, 6)))


def _ops_of(namespace):
    packet = getattr(torch.ops, namespace)
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith(namespace + "::"):
            yield getattr(getattr(packet, schema.name.split("::")[1]), schema.overload_name or "default")


def test_no_collective_ever_runs_for_real_while_propagating():
    """A rank propagating alone must not call its process group: collectives without a meta kernel
    (c10d's coalesced in-place ops) are refused, never run on the host."""
    kinds = {str(op): fxprop.lookup(op).kinds for namespace in ("c10d", "c10d_functional", "_c10d_functional",
                                                                "_c10d_functional_autograd", "_dtensor")
             for op in _ops_of(namespace)}
    assert len(kinds) > 40
    assert not [op for op, found in kinds.items() if fxprop.Kind.FALLBACK in found and not op.startswith("c10d_functional.")]
    assert all(fxprop.lookup(op).composite for op in _ops_of("c10d_functional"))  # parts: the ops above


def test_collectives_of_cuda_tensors_stay_on_their_device():
    gm, _ = fxprop.testing.call_graph(c10d.all_gather_into_tensor.default, (fxprop.TensorSpec((8, 6)), 8, "3"), {})
    out = fxprop.propagate(gm, fxprop.TensorSpec((8, 6), dtype=torch.bfloat16, device="cuda:1"))
    assert (tuple(out.shape), out.dtype, out.device) == ((64, 6), torch.bfloat16, torch.device("cuda", 1))


# --- opaque inputs -----------------------------------------------------------------------

def _graph_taking(form: str) -> torch.fx.GraphModule:
    """x and an opaque object in; a collective over the group the object is or names; both out."""
    graph = torch.fx.Graph()
    x, opaque = graph.placeholder("x"), graph.placeholder("opaque")
    if form == "script_object":  # no collective takes the boxed form: passed through
        graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (x, 2)), opaque))
    else:
        group = (graph.call_function(torch.ops._dtensor.mesh_get_process_group.default, (opaque, 0))
                 if form == "device_mesh" else opaque)
        reduced = graph.call_function(c10d.all_reduce.default, (x, "sum", group))
        graph.output((graph.call_function(c10d.wait_tensor.default, (reduced,)), opaque))
    return torch.fx.GraphModule(nn.Module(), graph)


@pytest.mark.parametrize("form", ["process_group", "device_mesh", "script_object"])
def test_an_opaque_input_passes_through_as_it_is(form):
    with simulated((4,)) as mesh:
        opaque = {"process_group": dist.group.WORLD, "script_object": dist.group.WORLD.boxed(),
                  "device_mesh": mesh}[form]
        gm = _graph_taking(form)
        fxprop.testing.assert_matches_real(gm, torch.randn(3, 4).t(), opaque)
        out, passed = fxprop.propagate(gm, torch.randn(3, 4).t(), opaque)
        assert passed is opaque and gm.graph.find_nodes(op="placeholder")[1].meta["val"] is opaque
        assert tuple(out.shape) == (4, 3) and out.stride() == ((3, 1) if form != "script_object" else (1, 4))
        if form == "device_mesh":
            group = next(n for n in gm.graph.nodes if n.target is torch.ops._dtensor.mesh_get_process_group.default)
            assert group.meta["val"] is mesh.get_group(0)
    assert isinstance(opaque, torch.ScriptObject) == (form == "script_object")


# --- simulated meshes ------------------------------------------------------------------------

def _local_shape(global_shape, placements, mesh):
    """The shard this rank holds, cut from a real tensor as torch.chunk cuts it."""
    tensor = torch.empty(global_shape)
    for dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            tensor = torch.chunk(tensor, mesh.size(dim), placement.dim)[mesh.get_coordinate()[dim]]
    return tuple(tensor.shape)


@pytest.mark.parametrize("shape,names", [((8, 8), ("dp", "tp")), ((2, 4, 8), ("pp", "dp", "tp"))],
                         ids=["8x8", "2x4x8"])
@pytest.mark.parametrize("rank", ["first", "last"])
def test_a_simulated_cuda_mesh_parallelizes_a_meta_model(shape, names, rank):
    size = torch.Size(shape).numel()
    rank = 0 if rank == "first" else size - 1
    with fxprop.mesh_simulation(shape, names, rank=rank) as mesh:
        assert (mesh.device_type, mesh.shape, mesh.mesh_dim_names) == ("cuda", shape, names)
        assert mesh.get_coordinate() == tuple(int(i) for i in torch.unravel_index(torch.tensor(rank), shape))
        assert not torch.cuda.is_initialized()
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(20, 44), nn.ReLU(), nn.Linear(44, 20))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        for parameter in model.parameters():
            local = parameter.to_local()
            assert local.device.type == "meta"
            assert tuple(local.shape) == _local_shape(parameter.shape, parameter.placements, mesh["tp"])
        placements = [Replicate()] * (len(shape) - 2) + [Shard(0), Shard(1)]
        weight = distribute_tensor(torch.empty(30, 50, device="meta"), mesh, placements)
        assert tuple(weight.to_local().shape) == _local_shape((30, 50), placements, mesh)
    assert not dist.is_initialized()


def test_simulated_meshes_in_sequence_and_released():
    first = fxprop.simulated_mesh((8, 8), ("dp", "tp"))
    same_world = fxprop.simulated_mesh(64, "x" and ("x",))
    assert dist.get_world_size() == 64 and same_world.shape == (64,) and first["tp"].size() == 8
    smaller = fxprop.simulated_mesh((2, 2))  # another number of ranks replaces the world
    assert dist.get_world_size() == 4 and smaller.shape == (2, 2)
    assert fxprop.release_simulated_mesh() is True
    assert fxprop.release_simulated_mesh() is False and not dist.is_initialized()
    with fxprop.mesh_simulation((2, 4, 8), ("pp", "dp", "tp")) as mesh:
        assert mesh["dp", "tp"].shape == (4, 8)
        with fxprop.mesh_simulation((64,)) as flat:  # as many ranks: the outer block's world, kept on exit
            assert flat.shape == (64,)
        assert dist.is_initialized()
        with pytest.raises(fxprop.InputError, match="still uses the simulated world of 64 ranks"):
            fxprop.simulated_mesh((8,))
    assert not dist.is_initialized()


def test_a_process_group_fxprop_did_not_make_is_never_touched():
    from fxprop.torch_compat import register_fake_process_group_backend
    register_fake_process_group_backend()
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=2)
    try:
        with pytest.raises(fxprop.InputError, match="did not make"):
            fxprop.simulated_mesh((2,))
        assert fxprop.release_simulated_mesh() is False and dist.is_initialized()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("call,match", [
    (lambda: fxprop.simulated_mesh(()), "shape"), (lambda: fxprop.simulated_mesh((2, 0)), "shape"),
    (lambda: fxprop.simulated_mesh((2, 2), ("a",)), "names"), (lambda: fxprop.simulated_mesh((2, 2), ("a", "a")), "names"),
    (lambda: fxprop.simulated_mesh((2,), "ab"), "names"), (lambda: fxprop.simulated_mesh((2,), rank=2), "rank"),
    (lambda: fxprop.simulated_mesh((2,), device_type="gpu"), "device_type"),
])
def test_a_simulated_mesh_refuses_what_it_cannot_build(call, match):
    with pytest.raises(fxprop.InputError, match=match):
        call()
    assert not dist.is_initialized()


# --- real ranks --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_each_ranks_graphs_match_their_real_execution_on_gloo(world_size):
    """Collectives, sequence parallel (static, training), tensor parallel (dynamic=True) and, on 4
    ranks, FSDP2 over tensor-parallel blocks on a 2x2 mesh: every forward and backward graph of
    every rank propagated and compared with AOT's metadata and with its real execution there. On 4
    ranks also DTensor values: a tensor-parallel MLP and a TP+SP Llama-style decoder traced with
    their DTensor parameters, placements, local shapes and collective counts equal to the real run's."""
    mp.spawn(cases.rank_worker, args=(world_size, _free_port()), nprocs=world_size, join=True)


def test_collective_meta_kernels_are_registered_at_the_first_collective_not_at_import():
    """``import fxprop`` leaves ``torch.distributed._functional_collectives`` unimported (it costs
    every program's cold start); a graph that calls a functional collective in a fresh process
    still gets its meta kernel, registered when the collective is first resolved."""
    import subprocess
    import sys
    program = """
import sys, torch, fxprop
assert "torch.distributed._functional_collectives" not in sys.modules
graph = torch.fx.Graph()
x = graph.placeholder("x")
gathered = graph.call_function(torch.ops._c10d_functional.all_gather_into_tensor.default, (x, 2, "0"))
graph.output(graph.call_function(torch.ops._c10d_functional.wait_tensor.default, (gathered,)))
gm = torch.fx.GraphModule(torch.nn.Module(), graph)
out = fxprop.propagate(gm, fxprop.TensorSpec((4, 8), device="cuda"))
assert tuple(out.shape) == (8, 8) and out.device.type == "cuda", out
print(gm.graph.find_nodes(op="call_function", target=torch.ops._c10d_functional.all_gather_into_tensor.default)[0]
      .meta["fxprop"].kind.value)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "meta"  # no python rule: the meta kernel registered at its resolution
