"""FSDP2 (`fully_shard`) graphs: FSDP's forward hooks emulated while propagating (`fxprop.distributed.fsdp`),
checked against the same model run eagerly with FSDP's real hooks on a simulated CPU mesh (torch's
fake process group) under CommDebugMode, and its per-rank estimate against the live storages of a
real run, on the simulated mesh and on 4 gloo ranks (``-m distributed``)."""
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard

import fxprop
from fxprop.distributed import parallel

import fsdp_cases as cases


def _check_against_eager(model, x, train):
    model.train(train)
    gm = parallel.trace(model)
    with torch.set_grad_enabled(train):
        fxprop.propagate(gm, x)
    outputs, counts = cases.propagated(gm)
    expected_outputs, expected_counts = cases.eager_reference(model, x, train=train)
    assert outputs == {name: expected_outputs[name] for name in outputs}
    assert counts == expected_counts
    return gm, counts


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("rank", [0, 3])
def test_blocks_and_root_layers_match_eager_uneven_shards_included(rank, train):
    """The root's own group (two Linear layers, 10 outputs over 4 ranks) gathered before the first
    node and kept; each block's group gathered in one all-gather before it runs, and let go after."""
    with fxprop.mesh_simulation((4,), device_type="cpu", rank=rank) as mesh:
        model = cases.blocks_and_root_layers(mesh)
        gm, counts = _check_against_eager(model, torch.randn(2, 16), train)
    assert counts == {"all_gather_into_tensor": 3}
    first = next(iter(gm.graph.nodes)).meta["fxprop_dtensor"]
    (root,) = first.gathers
    assert (root.parameters, root.resharded) == (("weight", "bias", "weight", "bias"), False)
    assert [r.steps for r in root.redistributions] == [((0, Shard(0), Replicate()),)] * 4
    block = next(n for n in gm.graph.nodes if n.target == "1").meta["fxprop_dtensor"]
    (gather,) = block.gathers
    assert gather.resharded and gather.collective in block.collectives and len(block.collectives) == 1


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_the_roots_parameters_read_by_the_graph_are_its_unsharded_ones(train):
    """The root's forward reads its gathered parameters (``get_attr`` nodes) as FSDP registers them
    while it runs: plain tensors, which meet the block's plain output."""
    with fxprop.mesh_simulation((4,), device_type="cpu", rank=3) as mesh:
        model = cases.scaled_head(mesh)
        gm, counts = _check_against_eager(model, torch.randn(2, 16), train)
    assert counts == {"all_gather_into_tensor": 2}
    read = {str(node.target): node.meta["val"] for node in gm.graph.nodes if node.op == "get_attr"}
    assert {name: (type(value).__name__, tuple(value.shape)) for name, value in read.items()} == \
        {"head.weight": ("FakeTensor", (10, 16)), "scale": ("FakeTensor", (10,))}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("hidden", [32, 30], ids=["even", "uneven"])
@pytest.mark.parametrize("rank", [0, 3])
def test_fsdp_over_tensor_parallel_blocks_matches_eager(rank, hidden, train):
    """On a 2x2 (dp, tp) mesh: the column-wise weights are strided shards on dp; each block's group
    is one all-gather on dp, its unsharded parameters DTensors on tp, whose all-reduce follows."""
    with fxprop.mesh_simulation((2, 2), ("dp", "tp"), device_type="cpu", rank=rank) as mesh:
        model = cases.fsdp_over_tensor_parallel(mesh, hidden)
        gm, counts = _check_against_eager(model, torch.randn(2, 8, 16), train)
    assert counts == {"all_gather_into_tensor": 2, "all_reduce": 2}
    gather = next(n for n in gm.graph.nodes if n.target == "0").meta["fxprop_dtensor"].gathers[0]
    assert gather.collective.mesh_dim == "dp" and gather.collective.group_size == 2


@pytest.mark.parametrize("seq,rank", [(16, 0), (10, 7)], ids=["even", "uneven"])
def test_llama_layers_fully_sharded_over_tp_sp_match_eager(seq, rank):
    with fxprop.mesh_simulation((2, 4), ("dp", "tp"), device_type="cpu", rank=rank) as mesh:
        model = cases.llama_fsdp_over_tp_sp(mesh)
        _, counts = _check_against_eager(model, torch.randint(0, 256, (2, seq)), False)
    layers = 2
    assert counts == {"all_gather_into_tensor": 3 * layers + 1 + layers + 1, "reduce_scatter_tensor": 2 * layers + 1}


class _AllGatherOutputs(torch.utils._python_dispatch.TorchDispatchMode):
    """The bytes of each all-gather FSDP runs for real."""

    def __init__(self):
        super().__init__()
        self.nbytes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.c10d._allgather_base_.default:
            self.nbytes.append(args[0].numel() * args[0].element_size())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("make,output_dtype", [(cases.blocks_and_root_layers, None), (cases.blocks, torch.float32)],
                         ids=["bf16_out", "fp32_out"])
def test_mixed_precision_gathers_in_param_dtype_as_fsdp_does(make, output_dtype):
    """``param_dtype``: inputs cast (the root's before the graph), parameters gathered in bfloat16
    (half the bytes), outputs in bfloat16 or cast to ``output_dtype`` (each block's, as its call
    returns it); each group's bytes those of FSDP's own all-gather."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, output_dtype=output_dtype)
    with fxprop.mesh_simulation((4,), device_type="cpu", rank=3) as mesh:
        model = make(mesh, mp_policy=policy)
        gm, _ = _check_against_eager(model, torch.randn(2, 16), False)
        gathers = [g for n in gm.graph.nodes if "fxprop_dtensor" in n.meta for g in n.meta["fxprop_dtensor"].gathers]
        real = _AllGatherOutputs()
        with real, torch.no_grad():  # a fresh model: after a forward, FSDP keeps its root's group gathered
            make(mesh, mp_policy=policy)(torch.randn(2, 16))
    assert {n.meta["val"].dtype for n in gm.graph.nodes if n.op == "call_module" and n.target == "1"} == \
        {output_dtype or torch.bfloat16}
    assert [g.buffer_bytes for g in gathers] == real.nbytes
    assert [g.collective.receive_bytes for g in gathers] == [nbytes * 3 // 4 for nbytes in real.nbytes]


def test_the_estimate_holds_the_callers_inputs_beside_their_cast_to_param_dtype():
    """FSDP's root pre-forward casts the float inputs to ``param_dtype``: the graph holds the cast,
    and the caller still holds its own float32 input, as the real run's live storages show."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    with fxprop.mesh_simulation((4,), device_type="cpu", rank=3) as mesh:
        x = torch.randn(2, 16)
        estimated = cases.estimated_live_bytes(cases.blocks_and_root_layers(mesh, mp_policy=policy), x)
        assert estimated == cases.real_live_bytes(cases.blocks_and_root_layers(mesh, mp_policy=policy), x)


@pytest.mark.parametrize("param_dtype,output_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
def test_a_block_runs_with_its_cast_input_and_its_output_before_the_cast_to_output_dtype(param_dtype, output_dtype):
    """A block's pre-forward casts its float32 input to ``param_dtype`` (a storage its forward
    holds), and its post-forward reshards before casting its output to ``output_dtype``: the
    bytes it ran with are its gathered parameters, its cast input and its output as it made it."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, output_dtype=output_dtype)
    with fxprop.mesh_simulation((4,), device_type="cpu", rank=3) as mesh:
        x = torch.randn(2, 16)
        estimated = cases.estimated_live_bytes(cases.blocks(mesh, mp_policy=policy), x)
        assert estimated == cases.real_live_bytes(cases.blocks(mesh, mp_policy=policy), x)


@pytest.mark.parametrize("make,fails_in", [(cases.blocks_and_root_layers, "_0"), (cases.blocks, "_0")],
                         ids=["failing_in_a_root_layer", "failing_in_a_gathered_block"])
def test_propagate_leaves_the_model_and_fsdp_state_as_they_were_success_or_failure(make, fails_in):
    """FSDP's hooks never run while propagating (its pre-forward would initialize its state
    lazily first): no lazy initialization, the same sharded parameters registered, its hooks
    in place, and the model's real forward afterwards works, as on a fresh model. A failure,
    in a root layer or inside a block whose parameters the emulation gathered, changes nothing
    either, the graph's annotations included."""
    with fxprop.mesh_simulation((4,), device_type="cpu") as mesh:
        model = make(mesh)
        fsdp_modules = [m for m in model.modules() if isinstance(m, torch.distributed.fsdp.FSDPModule)]
        before = {name: (parameter, parameter.to_local().clone()) for name, parameter in model.named_parameters()}
        hooks = [(dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()]
        gm = parallel.trace(model)
        fxprop.propagate(gm, torch.randn(2, 16))
        annotations = {node.name: dict(node.meta) for node in gm.graph.nodes}
        with pytest.raises(fxprop.PropagationError, match=f"%{fails_in}"):
            fxprop.propagate(gm, torch.randn(2, 15))  # the first layer takes 16 features
        assert annotations == {node.name: dict(node.meta) for node in gm.graph.nodes}
        assert all(fully_shard.state(m)._is_root is None for m in fsdp_modules)
        for name, parameter in model.named_parameters():
            assert parameter is before[name][0] and torch.equal(parameter.to_local(), before[name][1]), name
        assert hooks == [(dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()]
        assert model(torch.randn(2, 16)).shape[0] == 2
        assert fully_shard.state(model)._is_root is True


def test_the_estimate_counts_gathered_parameters_as_a_real_run_holds_them():
    """On the simulated CPU mesh (FSDP's real hooks over the fake process group): fxprop.estimate's
    live bytes after every node are the real run's (see fsdp_cases.LiveLocalBytesWithFsdp), on the
    first and last rank."""
    for rank in (0, 3):
        with fxprop.mesh_simulation((4,), device_type="cpu", rank=rank) as mesh_1d, \
                fxprop.mesh_simulation((2, 2), ("dp", "tp"), device_type="cpu", rank=rank) as mesh_2d:
            cases.check_estimate_against_real_run(mesh_1d, mesh_2d)


def test_a_grouped_fully_shard_gathers_once_and_reshards_after_its_last_module():
    with fxprop.mesh_simulation((4,), device_type="cpu", rank=3) as mesh:
        model = cases.grouped_blocks_and_root_layers(mesh)
        gm, counts = _check_against_eager(model, torch.randn(2, 16), False)
        first, second = (n.meta["fxprop_dtensor"] for n in gm.graph.nodes if n.target in ("1", "2"))
        assert counts == {"all_gather_into_tensor": 2} and len(first.gathers) == 1 and not second.gathers
        assert (first.released, second.released) == ([], first.gathers)
        model = cases.grouped_blocks_and_root_layers(mesh)
        assert cases.estimated_live_bytes(model, torch.randn(2, 16)) == cases.real_live_bytes(model, torch.randn(2, 16))


def test_reshard_after_forward_false_keeps_each_block_gathered():
    """The blocks' unsharded parameters stay live to the end of the graph, as in the real run."""
    with fxprop.mesh_simulation((4,), device_type="cpu") as mesh:
        model = cases.blocks_and_root_layers(mesh, reshard_after_forward=False)
        gm = parallel.trace(model)
        fxprop.propagate(gm, torch.randn(2, 16))
        blocks = [n.meta["fxprop_dtensor"].gathers[0] for n in gm.graph.nodes if n.target in ("1", "2")]
        kept = cases.estimated_live_bytes(model, torch.randn(2, 16))
        assert kept == cases.real_live_bytes(model, torch.randn(2, 16))
        resharded = cases.estimated_live_bytes(cases.blocks_and_root_layers(mesh), torch.randn(2, 16))
    assert not any(gather.resharded for gather in blocks)
    assert kept[-1][1] - resharded[-1][1] == sum(gather.unsharded_bytes for gather in blocks)


@pytest.mark.parametrize("make,x,match", [
    (cases.tied_across_groups, torch.randint(0, 10, (2, 5)), "shared with a parameter another FSDP group manages"),
    (cases.grouped_without_root, torch.randn(2, 16), "requires a single root module"),
    (cases.block_run_before_its_root, torch.randn(2, 16), "running forward through the root module first"),
], ids=["tied_across_groups", "grouped_root", "block_initialized_first"])
def test_what_fsdps_lazy_initialization_refuses_is_the_models_error(make, x, match):
    """FSDP's root refuses these as its first forward begins; propagating refuses them too, as the
    model's error of the same type, and leaves FSDP's states uninitialized as they were."""
    with fxprop.mesh_simulation((4,), device_type="cpu") as mesh:
        model = make(mesh)
        fsdp_modules = [m for m in model.modules() if isinstance(m, torch.distributed.fsdp.FSDPModule)]
        initialized = [fully_shard.state(m)._is_root for m in fsdp_modules]
        with pytest.raises(fxprop.PropagationError, match=match) as refused:
            fxprop.propagate(parallel.trace(model), x)
        assert [fully_shard.state(m)._is_root for m in fsdp_modules] == initialized
        with pytest.raises(Exception) as real:
            model(x)
    assert refused.value.refuses_like(real.value), real.value


def test_a_block_resharded_inside_the_node_of_its_enclosing_block_is_not_live_after_it():
    """The inner block's parameters are let go as its own forward ends, before the outer block's
    node does; the middle block's, kept gathered, and the outer block's own are live after it."""
    with fxprop.mesh_simulation((4,), device_type="cpu", rank=3) as mesh:
        model = cases.nested_three_levels(mesh)
        gm, counts = _check_against_eager(model, torch.randn(2, 16), False)
        outer = next(n for n in gm.graph.nodes if n.target == "0").meta["fxprop_dtensor"]
        x = torch.randn(2, 16)
        estimated = cases.estimated_live_bytes(cases.nested_three_levels(mesh), x)
        assert estimated == cases.real_live_bytes(cases.nested_three_levels(mesh), x)
    assert counts == {"all_gather_into_tensor": 4}
    assert [(g.module, g.resharded) for g in outer.gathers] == [("FSDPSequential", True), ("FSDPSequential", False),
                                                                ("FSDPMLP", True)]
    assert outer.released_within == outer.gathers[2:] and outer.released == outer.gathers[:1]


def test_a_model_sharded_on_a_released_simulated_mesh_is_refused_as_bad_input():
    """Once its simulated world is released (or replaced by another), the mesh's process groups are
    gone: the model's error it is not, and the refusal comes before any node."""
    with fxprop.mesh_simulation((4,), device_type="cpu") as mesh:
        model = cases.blocks_and_root_layers(mesh)
        gm = parallel.trace(model)
    with pytest.raises(fxprop.InputError, match="process group was destroyed"):
        fxprop.propagate(gm, torch.randn(2, 16))
    with fxprop.mesh_simulation((4,), device_type="cpu"), \
            pytest.raises(fxprop.InputError, match="process group was destroyed"):
        fxprop.propagate(gm, torch.randn(2, 16))
    assert not any("val" in node.meta for node in gm.graph.nodes)


def test_reshard_after_forward_onto_a_smaller_mesh_is_refused():
    with fxprop.mesh_simulation((4,), device_type="cpu") as mesh:
        model = cases.blocks_and_root_layers(mesh, reshard_after_forward=2)
        with pytest.raises(fxprop.UnsupportedError, match="reshard_after_forward=2"):
            fxprop.propagate(parallel.trace(model), torch.randn(2, 16))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.distributed
def test_the_estimate_matches_the_live_storages_of_real_gloo_ranks():
    """On 4 gloo ranks, FSDP's real all-gathers included: each rank's fxprop.estimate live bytes
    after every node equal its real run's (blocks with an uneven split and a root group on 4 ranks;
    FSDP over tensor-parallel blocks on 2x2, split unevenly)."""
    mp.spawn(cases.rank_worker, args=(4, _free_port()), nprocs=4, join=True)
