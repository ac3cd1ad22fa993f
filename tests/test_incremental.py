"""repropagate re-annotates only what an edit reaches, and agrees with a full propagate."""
import copy

import pytest
import torch
import torch.nn.functional as F

import fxprop
from fxprop import examples


def annotations(gm):
    def describe(value):
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad)
        if isinstance(value, (list, tuple)):
            return tuple(describe(v) for v in value)
        return value
    return {n.name: (describe(n.meta["val"]), n.meta["fxprop"].kind) for n in gm.graph.nodes}


def llama_graph():
    model = examples.llama_on_meta(3, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=50)
    return torch.fx.symbolic_trace(model), (fxprop.TensorSpec((2, 16), dtype=torch.int64, device="meta"),)


def test_editing_one_node_matches_a_full_propagate_and_touches_only_downstream():
    gm, inputs = llama_graph()
    fxprop.propagate(gm, *inputs)
    silus = [n for n in gm.graph.nodes if n.target is F.silu]
    target = silus[1]
    with gm.graph.inserting_after(target):
        widened = gm.graph.call_function(torch.cat, ([target, target],), {"dim": -1})
    with gm.graph.inserting_after(widened):
        narrowed = gm.graph.call_method("narrow", (widened, -1, 0, 96))
    target.replace_all_uses_with(narrowed, delete_user_cb=lambda user: user not in (widened,))
    gm.recompile()
    untouched_before = {n.name: n.meta["val"] for n in gm.graph.nodes if n.meta.get("val") is not None}
    touched = fxprop.repropagate(gm, [widened, narrowed])
    assert widened in touched and narrowed in touched
    assert all(node not in touched for node in silus[:1])
    for node in gm.graph.nodes:
        if node not in touched and node.name in untouched_before:
            assert node.meta["val"] is untouched_before[node.name]

    full = copy.deepcopy(gm)
    for node in full.graph.nodes:
        node.meta.clear()
    fxprop.propagate(full, *inputs)
    assert annotations(gm) == annotations(full)


def test_new_nodes_are_found_without_being_named():
    gm, inputs = llama_graph()
    fxprop.propagate(gm, *inputs)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    logits = output.args[0]
    with gm.graph.inserting_before(output):
        probs = gm.graph.call_function(torch.softmax, (logits, -1))
    output.args = (probs,)
    assert fxprop.repropagate(gm) == {probs, output}
    assert probs.meta["val"].shape == (2, 16, 50)


def test_a_failed_repropagate_changes_nothing():
    gm, inputs = llama_graph()
    fxprop.propagate(gm, *inputs)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        bad = gm.graph.call_function(torch.matmul, (output.args[0], output.args[0]))
    output.args = (bad,)
    before = {n.name: dict(n.meta) for n in gm.graph.nodes}
    with pytest.raises(fxprop.PropagationError, match="matmul"):
        fxprop.repropagate(gm)
    assert {n.name: dict(n.meta) for n in gm.graph.nodes} == before


def test_progress_reports_every_node_then_the_total():
    gm, inputs = llama_graph()
    seen = []
    fxprop.propagate(gm, *inputs, progress=lambda done, total: seen.append((done, total)))
    total = len(gm.graph.nodes)
    assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) == total + 1


def test_repropagate_keeps_the_values_of_inputs_passed_for_real():
    """x1[:x0.item()] with x0 a real tensor: its value sizes the slice, after an edit downstream of
    item (which only reads, so not every node runs again) and after one that makes item run again."""
    import operator
    graph = torch.fx.Graph()
    x0, x1 = graph.placeholder("x0"), graph.placeholder("x1")
    count = graph.call_method("item", (x0,))
    sliced = graph.call_function(operator.getitem, (x1, (slice(None, count, None),)))
    graph.output(sliced)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    fxprop.propagate(gm, torch.tensor(3), torch.arange(5))
    with graph.inserting_after(sliced):
        copied = graph.call_method("clone", (sliced,))
    sliced.replace_all_uses_with(copied, delete_user_cb=lambda user: user is not copied)
    assert {n.name for n in fxprop.repropagate(gm)} == {"clone", "output"}
    assert gm.graph.output_node().meta["val"].shape == (3,)
    count.args = (x0,)  # re-run item itself, on the annotation of x0
    assert "item" in {n.name for n in fxprop.repropagate(gm, [count])}
    assert gm.graph.output_node().meta["val"].shape == (3,)
