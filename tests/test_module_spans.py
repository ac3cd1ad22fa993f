"""fxprop.cli.module_spans: the spans the live-bytes plot marks, against the order a real forward enters modules."""
import pytest
import torch

from fxprop import examples
from fxprop.cli.module_spans import default_depth, label_at, module_spans, node_labels, normalized_path
from fxprop.cli.tracing import trace_model


def modules_entered(model: torch.nn.Module, inputs: tuple, depth: int) -> list[str]:
    """The modules ``depth`` names deep (or leaves less deep), in the order a real forward enters them."""
    entered: list[str] = []
    hooks = [module.register_forward_pre_hook(lambda _module, _args, name=name: entered.append(name))
             for name, module in model.named_modules()
             if name and (name.count(".") + 1 == depth
                          or name.count(".") + 1 < depth and not list(module.children()))]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return entered


@pytest.mark.parametrize("tracer", ["export", "symbolic", "dynamo"])
def test_spans_follow_the_modules_real_execution_enters(tracer):
    model, inputs = examples.gpt_example()
    gm = trace_model(model, inputs, (tracer,)).graphs[0][0]
    layers = [span.label for span in module_spans(node_labels(gm))]
    assert layers == modules_entered(model, inputs, 2) == ["wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"]
    deeper = [span.label for span in module_spans(node_labels(gm, depth=3))]
    # h.0's own code (the residual adds, the gelu) runs between its children: spans of h.0 there
    entered = modules_entered(model, inputs, 3)
    assert [label for label in deeper if label in entered] == entered
    assert "h.0" in deeper[deeper.index("h.0.attn"):deeper.index("h.0.ln_2")]


def test_the_default_depth_is_the_repeated_layers():
    assert default_depth(["model.embed_tokens", "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj",
                          "model.layers.1.mlp", "model.norm", "lm_head"]) == 3
    assert default_depth(["h.0.attn.c_attn", "h.1.attn", "stem.0", "ln_f"]) == 2
    assert default_depth(["encoder", "decoder.proj"]) == 1  # nothing repeats: the root's children


def test_calls_in_the_root_break_spans_and_other_nodes_do_not():
    labels = [None, "a", None, "a", "", "a", "b", None]  # placeholder, call, get_attr, call, root call, ...
    assert [(s.label, s.start, s.stop) for s in module_spans(labels)] == [("a", 1, 3), ("a", 5, 5), ("b", 6, 6)]
    assert label_at(labels, 7) == "b" and label_at(labels, 2) == "a" and label_at(labels, 0) == ""


@pytest.mark.parametrize("path, plain", [("L['self'].h[0]._modules['attn']", "h.0.attn"), ("L['self'].wte", "wte"),
                                         ("L['self']", ""), ("model.layers.0.mlp", "model.layers.0.mlp")])
def test_dynamo_paths_are_read_as_module_names(path, plain):
    assert normalized_path(path) == plain


@pytest.mark.parametrize("module", ["fxprop.cli.module_spans", "fxprop.cli.tracing"])
def test_docstring_examples(module):
    import doctest
    import importlib
    found = doctest.testmod(importlib.import_module(module))
    assert found.failed == 0 and found.attempted > 0
