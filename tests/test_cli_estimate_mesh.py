"""``fxprop estimate ... --mesh dp=2,tp=2``: one rank's figures, checked against the same rank run for real.

With ``--device cpu`` the mesh is a simulated ``cpu`` mesh, on which DTensor programs run for real
in this one process (the fake process group runs the real collective kernels, on this rank's data):

- *graph*: the model built with real weights, parallelized the same way, its step traced with real
  local tensors and run node by node by ``test_estimate.measure``: every node's live bytes and
  FLOPs equal the estimate's, and the command's peak and FLOPs (traced on the meta device) equal
  the real run's. Tolerance: none.
- *eager*: the parallelized model's ordinary step, ``loss.backward(); optimizer.step()``: the
  bytes of the rank's local parameters, of its gradients (``p.grad``'s local tensors) and of its
  optimizer state (``optimizer.state``'s local tensors) equal the command's, to the byte.
"""
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

import fxprop
from fxprop.cli import transformers_parallel
from fxprop.cli.main import main
from fxprop.distributed.dtensors import local_of
from fxprop.estimate import optimizers
from fxprop.estimate.traced_step import trace_inference_step, trace_training_step
from fxprop.torch_compat import storage_key
from test_cli_estimate_config import BATCH, SEQ, TINY, estimate_json, real_batch, real_model, usage_error
from test_estimate import assert_matches, measure

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


def local_bytes(tensors) -> int:
    """Bytes of the distinct storages of the tensors' local tensors."""
    storages = {storage_key(local_of(t)): local_of(t).untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())


def assert_an_eager_step_holds(found: dict, model, optimizer) -> None:
    """The rank's parameter, gradient and optimizer-state bytes equal those of an eager step of ``model``."""
    model(**real_batch()).loss.backward()
    gradients = local_bytes(p.grad for p in model.parameters())
    optimizer.step()
    state = local_bytes(value for entry in optimizer.state.values() for value in entry.values())
    assert found["parameter_bytes"] == local_bytes(model.parameters())
    assert found["gradient_bytes"] == gradients
    assert found["optimizer_state_bytes"] + sum(found["optimizer_state_elsewhere"].values()) == state


def parallel_model(mesh):
    model = real_model("llama")
    transformers_parallel.parallelize(model, mesh)
    optimizer = optimizers.build("adamw", transformers_parallel.parameter_groups(list(model.parameters())), CPU)
    return model, optimizer


@pytest.mark.parametrize("shape, names, rank", [((2,), ("tp",), 1), ((2, 2), ("dp", "tp"), 2)],
                         ids=["tp2_rank1", "dp2_tp2_rank2"])
def test_a_rank_of_a_training_step_matches_the_rank_run_for_real(shape, names, rank, capsys):
    mesh_arg = ",".join(f"{name}={size}" for name, size in zip(names, shape))
    found = estimate_json(capsys, *TINY["llama"], "--device", "cpu", "--batch", str(BATCH), "--seq", str(SEQ),
                          "--train", "--mesh", mesh_arg, "--rank", str(rank))
    assert found["setup"]["mesh"] == dict(zip(names, shape)) and found["setup"]["rank"] == rank
    with fxprop.mesh_simulation(shape, names, device_type="cpu", rank=rank) as mesh:
        model, optimizer = parallel_model(mesh)
        optimizers.create_state(optimizer)
        step = trace_training_step(model, optimizer, real_batch(), CPU)
        est = fxprop.estimate(step.gm, *step.inputs)
        assert_matches(est, measure(step.gm, *step.inputs))
        # make_fx of real tensors keeps the DTensor embedding's ``torch.tensor`` literals (two CPU scalars)
        # as graph constants, resident; traced on the meta device they are scalar_tensor nodes, freed after use
        constants = est.state_bytes.get("cpu", 0)
        assert (found["peak"]["node"], found["peak"]["bytes"], found["flops"]) == (
            est.peak_node["cpu"], est.peak_bytes["cpu"] - constants, est.flops)

        assert_an_eager_step_holds(found, *parallel_model(mesh))
    assert found["comm"]["all_reduce"]["count"] > 0


def test_a_rank_of_a_forward_pass_matches_the_rank_run_for_real_collectives_included(capsys):
    """Without gradients transformers' row-wise layers all-reduce with ``dist.all_reduce`` (in place,
    not DTensor's): the collectives are counted as torch's CommDebugMode counts the eager pass's."""
    from torch.distributed.tensor.debug import CommDebugMode
    found = estimate_json(capsys, *TINY["llama"], "--device", "cpu", "--batch", str(BATCH), "--seq", str(SEQ),
                          "--mesh", "dp=2,tp=2", "--rank", "1")
    with fxprop.mesh_simulation((2, 2), ("dp", "tp"), device_type="cpu", rank=1) as mesh:
        model, _ = parallel_model(mesh)
        model.eval()
        batch = {"input_ids": real_batch()["input_ids"]}
        step = trace_inference_step(model, batch, CPU)
        est = fxprop.estimate(step.gm, *step.inputs)
        assert_matches(est, measure(step.gm, *step.inputs))
        constants = est.state_bytes.get("cpu", 0)  # as in the training step above
        assert (found["peak"]["bytes"], found["flops"]) == (est.peak_bytes["cpu"] - constants, est.flops)
        with torch.no_grad(), CommDebugMode() as comm:
            model(**batch)
    counted = {str(op).split(".")[-1]: count for op, count in comm.get_comm_counts().items()}
    assert {kind: entry["count"] for kind, entry in found["comm"].items()} == {
        "all_gather_into_tensor": counted["all_gather_into_tensor"],
        "all_reduce": counted["all_reduce"] + counted["allreduce_"]}


def test_tensor_parallel_shards_the_linear_layers_over_the_tp_ranks(capsys):
    args = [*TINY["llama"], "--seq", "8", "--train"]
    whole = estimate_json(capsys, *args)
    sharded = estimate_json(capsys, *args, "--mesh", "tp=2")
    with fxprop.mesh_simulation((2,), ("tp",), device_type="cuda") as mesh:
        model = real_model("llama").to("meta")
        transformers_parallel.parallelize(model, mesh)
        planned = [p for p in model.parameters() if hasattr(p, "placements")]
        others = [p for p in model.parameters() if not hasattr(p, "placements")]
        assert all(local_of(p).numel() * 2 == p.numel() for p in planned)  # every planned tensor split in two
    assert sharded["parameters"] == sum(local_of(p).numel() for p in planned + others)
    assert sharded["parameters"] == sum(p.numel() for p in planned) // 2 + sum(p.numel() for p in others)
    assert whole["parameters"] == sum(p.numel() for p in planned + others)
    assert sharded["optimizer_state_bytes"] == 2 * sharded["parameter_bytes"]


@pytest.mark.parametrize("args, message", [
    (["--mesh", "pp=2,tp=2"], "unknown mesh dim 'pp'"),
    (["--mesh", "tp=3"], "num_attention_heads=4 is not a multiple of 3"),
    (["--mesh", "tp=4"], "num_key_value_heads=2 is not a multiple of 4"),
    (["--mesh", "dp=2,tp=2", "--rank", "4"], "--rank 4: the mesh has ranks 0 to 3"),
    (["--mesh", "tp=2x"], "--mesh: 'tp=2x' is not NAME=SIZE"),
    (["--rank", "1"], "--rank 1 needs --mesh"),
], ids=["dim_name", "heads", "kv_heads", "rank", "form", "rank_alone"])
def test_a_mesh_the_command_cannot_shard_is_a_usage_error(args, message, capsys):
    source, *overrides = TINY["llama"]
    if "tp=4" in args:
        overrides = [o for o in overrides if not o.startswith("num_attention_heads")] + ["num_attention_heads=8"]
    error = usage_error(capsys, source, *overrides, "--seq", "8", *args)
    assert message in error and "Traceback" not in error


def test_a_model_without_a_tensor_parallel_plan_is_refused(capsys):
    error = usage_error(capsys, *TINY["gpt2"], "--seq", "8", "--mesh", "tp=2")
    assert "GPT2LMHeadModel (gpt2) has no tensor-parallel plan in transformers" in error


# --- tied weights, uneven shards, optimizers DTensor refuses ------------------------------

TIED = [*TINY["llama"], "tie_word_embeddings=True"]


def tied_model():
    from fxprop.cli.transformers_models import load_config, parse_override
    source, *overrides = TIED
    torch.manual_seed(0)
    config = load_config(source, dict(map(parse_override, overrides)))
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()


@pytest.mark.parametrize("shape, names, rank", [((2,), ("tp",), 1), ((2,), ("dp",), 1), ((2, 2), ("dp", "tp"), 3)],
                         ids=["tp2_rank1", "dp2_rank1", "dp2_tp2_rank3"])
def test_tied_embeddings_stay_tied_and_match_the_rank_run_for_real(shape, names, rank, capsys):
    """The plan names the tied LM head's weight, which named_parameters lists once: applied as
    from_pretrained applies it (untied, planned, tied again), and FSDP's shard shared by both modules."""
    mesh_arg = ",".join(f"{name}={size}" for name, size in zip(names, shape))
    found = estimate_json(capsys, *TIED, "--device", "cpu", "--batch", str(BATCH), "--seq", str(SEQ), "--train",
                          "--mesh", mesh_arg, "--rank", str(rank))
    with fxprop.mesh_simulation(shape, names, device_type="cpu", rank=rank) as mesh:
        def build():
            model = transformers_parallel.parallelize(tied_model(), mesh)
            assert model.lm_head.weight is model.model.embed_tokens.weight
            return model, optimizers.build("adamw", transformers_parallel.parameter_groups(list(model.parameters())),
                                           CPU)
        model, optimizer = build()
        optimizers.create_state(optimizer)
        step = trace_training_step(model, optimizer, real_batch(), CPU)
        est = fxprop.estimate(step.gm, *step.inputs)
        assert_matches(est, measure(step.gm, *step.inputs))
        constants = est.state_bytes.get("cpu", 0)  # as in the training step above
        assert (found["peak"]["bytes"], found["flops"]) == (est.peak_bytes["cpu"] - constants, est.flops)
        assert_an_eager_step_holds(found, *build())


def test_an_uneven_last_shard_counts_its_padded_storage_as_the_rank_holds_it():
    """distribute_tensor cuts 256 rows over 3 ranks as 86, 86, 84, the last a view of a padded
    storage of 86 rows: the inputs of the rank's step hold what their storages hold."""
    with fxprop.mesh_simulation((3,), ("dp",), device_type="cpu", rank=2) as mesh:
        model = transformers_parallel.parallelize(real_model("llama"), mesh)
        optimizer = optimizers.build("adamw", transformers_parallel.parameter_groups(list(model.parameters())), CPU)
        optimizers.create_state(optimizer)
        step = trace_training_step(model, optimizer, real_batch(), CPU)
        assert any(local_of(p).untyped_storage().nbytes() > local_of(p).nbytes for p in model.parameters())
        assert_matches(fxprop.estimate(step.gm, *step.inputs), measure(step.gm, *step.inputs))


@pytest.mark.parametrize("mesh_arg", ["dp=2", "tp=2"])
def test_adafactor_on_dtensor_parameters_is_refused_as_torch_refuses_its_step(mesh_arg, capsys):
    shape, names = (2,), (mesh_arg.split("=")[0],)
    with fxprop.mesh_simulation(shape, names, device_type="cpu") as mesh:
        model = transformers_parallel.parallelize(real_model("llama"), mesh)
        optimizer = optimizers.build("adafactor", transformers_parallel.parameter_groups(list(model.parameters())),
                                     CPU)
        model(**real_batch()).loss.backward()
        with pytest.raises(RuntimeError, match="pow_"):
            optimizer.step()
    error = usage_error(capsys, *TINY["llama"], "--seq", "8", "--train", "--optimizer", "adafactor",
                        "--mesh", mesh_arg)
    assert "torch.optim.Adafactor cannot step DTensor parameters" in error and "Traceback" not in error
