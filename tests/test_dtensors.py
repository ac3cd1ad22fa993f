"""DTensor values through a graph (`fxprop.distributed.dtensors`): each module's output placements and local
shapes, and the collectives by kind, against the same model run eagerly on meta DTensors on the
same simulated mesh under CommDebugMode (`distributed_cases.eager_reference`)."""
import pytest
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import fxprop
from fxprop.distributed import parallel

import distributed_cases as cases


def _check_against_eager(model, gm, spec, eager_input, **options):
    fxprop.propagate(gm, spec, **options)
    expected_outputs, expected_counts = cases.eager_reference(model, eager_input)
    outputs, counts = cases.propagated(gm)
    assert outputs == {name: expected_outputs[name] for name in outputs}
    assert counts == expected_counts
    return counts


@pytest.mark.parametrize("rank", [0, 3])
def test_tensor_parallel_mlp_matches_eager(rank):
    with fxprop.mesh_simulation((4,), ("tp",), rank=rank) as mesh:
        with torch.device("meta"):
            model = cases.tensor_parallel(mesh)
        gm = torch.fx.symbolic_trace(model)
        counts = _check_against_eager(model, gm, fxprop.TensorSpec((2, 8, 16), device="cuda"), torch.empty(2, 8, 16, device="meta"))
    assert counts == {"all_reduce": 1}
    down = next(node for node in gm.graph.nodes if node.target == "down").meta["fxprop_dtensor"]
    assert [(r.source, r.target) for r in down.redistributions if r.collectives] == [((Partial(),), (Replicate(),))]
    collective = down.collectives[0]
    assert (collective.mesh_dim, collective.group_size, collective.send_bytes) == ("tp", 4, 2 * 3 * 2 * 8 * 16 * 4 // 4)


def Partial():
    from torch.distributed.tensor import Partial as P
    return P()


@pytest.mark.parametrize("rank", [0, 3])
def test_sequence_parallel_mlp_matches_eager(rank):
    """The input is each rank's sequence shard (SequenceParallel takes a local tensor as one)."""
    with fxprop.mesh_simulation((4,), ("tp",), rank=rank) as mesh:
        with torch.device("meta"):
            model = cases.sequence_parallel(mesh)
        gm = torch.fx.symbolic_trace(model)
        counts = _check_against_eager(model, gm, fxprop.TensorSpec((2, 8, 16), device="cuda"),
                                      torch.empty(2, 8, 16, device="meta"))
    assert counts == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1}
    norm = next(node for node in gm.graph.nodes if node.target == "norm").meta["fxprop_dtensor"].outputs[0]
    assert (norm.placements, norm.shape, norm.local_shape) == ((Shard(1),), (2, 32, 16), (2, 8, 16))


@pytest.mark.parametrize("seq", [16, 10], ids=["even", "uneven"])
@pytest.mark.parametrize("fsdp", [False, True], ids=["tp_sp", "fsdp_tp_sp"])
@pytest.mark.parametrize("rank", [0, 7])
def test_llama_with_tp_sp_and_fsdp_matches_eager_uneven_shards_included(seq, fsdp, rank):
    with fxprop.mesh_simulation((2, 4), ("dp", "tp"), rank=rank) as mesh:
        model = cases.tiny_llama(mesh, fsdp=fsdp)
        gm = parallel.trace(model)
        tokens = fxprop.TensorSpec((2, seq), dtype=torch.int64, device="cuda")
        counts = _check_against_eager(model, gm, tokens, torch.empty(2, seq, dtype=torch.int64, device="meta"),
                                      param_device="cuda")
        embedding = next(n for n in gm.graph.nodes if n.target == "tok_embeddings").meta["fxprop_dtensor"].outputs[0]
        shard = -(-seq // 4)
        assert list(embedding.local_shapes.values()) == [(2, min(shard, max(seq - shard * (r % 4), 0)), 64)
                                                         for r in range(4)]  # its tp group's ranks
        assert embedding.local_shape == embedding.local_shapes[rank]
    layers = cases.tiny_llama_config().n_layers
    fsdp_gathers = (9 * layers + 3) if fsdp else 0  # one per module holding parameters
    assert counts == {"all_gather_into_tensor": 3 * layers + 1 + fsdp_gathers, "reduce_scatter_tensor": 2 * layers + 1}


def test_dtensor_inputs_of_a_dynamo_graph_propagate_as_dynamo_traced_them():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward
    with fxprop.mesh_simulation((4,), device_type="cpu") as mesh:
        torch._dynamo.reset()
        torch.compile(cases.tensor_parallel(mesh), backend=backend)(torch.randn(2, 16))
        gm, inputs = graphs[0]
        traced = {node.name: node.meta.get("example_value") for node in gm.graph.nodes}
        assert any(isinstance(value, DTensor) for value in inputs)
        fxprop.propagate(gm, *inputs)
    for node in gm.graph.nodes:
        if isinstance(traced[node.name], DTensor):
            assert cases.describe(node.meta["val"]) == cases.describe(traced[node.name]), node.name
            assert isinstance(node.meta["val"].to_local(), torch._subclasses.FakeTensor)
    kinds = [c.kind for n in gm.graph.nodes if "fxprop_dtensor" in n.meta for c in n.meta["fxprop_dtensor"].collectives]
    assert kinds == ["all_reduce"]


def test_a_dtensor_made_in_the_graph_propagates_with_its_redistribution():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward
    with fxprop.mesh_simulation((4,), device_type="cpu") as mesh:
        def f(x):
            return (DTensor.from_local(x, mesh, [Shard(0)], run_check=False) * 2).redistribute(mesh, [Replicate()])
        torch._dynamo.reset()
        torch.compile(f, backend=backend)(torch.randn(2, 3))
        gm, inputs = graphs[0]
        out = fxprop.propagate(gm, *inputs)
    assert cases.describe(out) == (("DTensor", (Replicate(),), (8, 3), (8, 3)),)
    redistribute = next(n for n in gm.graph.nodes if n.target == "redistribute").meta["fxprop_dtensor"]
    (step,) = redistribute.redistributions
    assert (step.argument, step.source, step.target, step.explicit) == (0, (Shard(0),), (Replicate(),), True)
    assert [(c.kind, c.send_bytes) for c in step.collectives] == [("all_gather_into_tensor", 8 * 3 * 4 * 3 // 4)]


def test_a_tensor_spec_with_a_mesh_is_a_dtensor_input():
    def f(x, w):
        return torch.mm(x, w).relu()
    with fxprop.mesh_simulation((4,), ("tp",), rank=3) as mesh:
        gm = torch.fx.symbolic_trace(f)
        weight = distribute_tensor(torch.empty(16, 10, device="meta"), mesh, [Shard(1)])
        out = fxprop.propagate(gm, fxprop.TensorSpec((6, 16), mesh=mesh, placements=(Shard(0),)), weight)
        with torch.no_grad():
            expected = f(distribute_tensor(torch.empty(6, 16, device="meta"), mesh, [Shard(0)]), weight)
    assert cases.describe(out) == cases.describe(expected) == ("DTensor", (Shard(1),), (6, 1), (6, 10))
    assert out.device.type == "cuda" and out.to_local().device == torch.device("cuda", 0)
    mm = next(n for n in gm.graph.nodes if n.name == "mm").meta["fxprop_dtensor"]
    assert mm.flops == 2 * 6 * 16 * 1 and mm.outputs[0].local_shapes == {0: (6, 3), 1: (6, 3), 2: (6, 3), 3: (6, 1)}


@pytest.mark.parametrize("spec,match", [
    (lambda mesh: fxprop.TensorSpec((4,), mesh=mesh), "go together"),
    (lambda mesh: fxprop.TensorSpec((4,), mesh=mesh, placements=(Shard(0), Shard(0))), "one placement per mesh dim"),
])
def test_a_dtensor_spec_is_checked(spec, match):
    with fxprop.mesh_simulation((4,)) as mesh:
        with pytest.raises(fxprop.InputError, match=match):
            spec(mesh)


def test_graphs_without_dtensors_keep_the_plain_dispatch():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 8))
    fxprop.propagate(gm, fxprop.TensorSpec((2, 4)))
    assert gm.meta["fxprop"]["dtensors"] is False
    assert not any("fxprop_dtensor" in node.meta for node in gm.graph.nodes)


def test_an_op_dtensor_has_no_sharding_strategy_for_is_refused_naming_it_and_the_placements():
    """Eager DTensor raises NotImplementedError for ``renorm``; fxprop takes placements from DTensor
    alone, so it cannot answer either: UnsupportedError, with the op and the placements."""
    from torch.distributed.tensor import Shard, distribute_tensor
    with fxprop.mesh_simulation((4,), ("x",), device_type="cpu") as mesh:
        x = distribute_tensor(torch.randn(8, 8, device="meta"), mesh, [Shard(0)])
        with pytest.raises(NotImplementedError, match="sharding strategy"):
            torch.renorm(x, 2, 0, 1.0)
        gm = torch.fx.symbolic_trace(lambda t: torch.renorm(t * 2, 2, 0, 1.0))
        with pytest.raises(fxprop.UnsupportedError, match=r"aten\.renorm\.default.*Shard\(dim=0\)"):
            fxprop.propagate(gm, x)


def test_the_command_line_propagates_one_rank_of_a_planned_mesh_as_eager_dtensors_run(capsys):
    """``fxprop run ... --mesh dp=2,tp=4 --plan tp``: the rank's collectives are the ones the same
    model, parallelized the same way, runs eagerly on meta DTensors; its parameter bytes are its
    local shards'."""
    import json
    from fxprop.cli import meshes
    from fxprop.cli.main import main
    import importlib
    cli_models = importlib.import_module("tests.cli_models")  # the module the command line imports
    code = main(["run", "tests.cli_models:tiny_llama", "--mesh", "dp=2,tp=4", "--plan", "tp", "--rank", "5",
                 "--param-device", "cuda:0", "--format", "json"])
    assert code == 0
    found = json.loads(capsys.readouterr().out)["estimate"]
    with fxprop.mesh_simulation((2, 4), ("dp", "tp"), rank=5) as mesh:
        model = meshes.parallelize(cli_models.tiny_llama()[0], mesh, "tp")
        _, counts = cases.eager_reference(model, torch.empty(2, 16, dtype=torch.int64, device="meta"))
        local_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    assert {kind: entry["count"] for kind, entry in found["comm"].items()} == counts
    assert found["state_bytes"]["cuda:0"] >= local_bytes  # parameters, plus the model's buffers


def test_the_command_line_refuses_a_mesh_it_cannot_build(capsys):
    from fxprop.cli.main import main
    with pytest.raises(SystemExit) as exited:
        main(["run", "tests.cli_models:tiny_llama", "--mesh", "dp=2,dp=4", "--plan", "tp"])
    assert exited.value.code == 2 and "given twice" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["run", "tests.cli_models:tiny_llama", "--mesh", "dp=2", "--plan", "tp"])
    assert exited.value.code == 2 and "mesh dim named tp" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["run", "tests.cli_models:tiny_llama", "--mesh", "dp=2,tp=4", "--rank", "8"])
    assert exited.value.code == 2 and "ranks 0 to 7" in capsys.readouterr().err
