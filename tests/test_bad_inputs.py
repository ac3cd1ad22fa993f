"""The bad-input table (docs/concepts/errors.md, "Bad inputs"): each wrong call or malformed graph gets one clear error.

Wrong calls raise `fxprop.InputError` before any node is visited. A graph or a value that
only fails where a node uses it raises `fxprop.PropagationError` naming that node. Neither
leaves metadata behind, and neither touches the module or the inputs.
"""
import math

import numpy as np
import pytest
import torch

import fxprop
from fxprop.testing import assert_matches_real, assert_no_side_effects


def linear():
    return torch.fx.symbolic_trace(torch.nn.Linear(2, 2))


def traced(forward):
    class Model(torch.nn.Module):
        pass
    Model.forward = forward
    return torch.fx.symbolic_trace(Model())


def with_buffer_removed():
    model = torch.nn.Module()
    model.register_buffer("scale", torch.ones(2))
    model.forward = None
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.mul, (x, graph.get_attr("scale"))))
    gm = torch.fx.GraphModule(model, graph)
    del gm.scale
    return gm


def with_submodule_removed():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    del gm._modules["0"]
    return gm


def used_before_defined():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.relu, (x,))
    neg = graph.call_function(torch.neg, (relu,))
    graph.output(neg)
    x.append(neg)  # neg now comes before relu, which it reads
    with pytest.raises(RuntimeError, match="used before it has been defined"):
        graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def from_another_graph():
    other = torch.fx.Graph()
    relu = other.call_function(torch.relu, (other.placeholder("a"),))
    graph = torch.fx.Graph()
    graph.output(graph.call_function(torch.neg, (graph.placeholder("x"),)))
    neg = next(n for n in graph.nodes if n.op == "call_function")
    neg.args = (relu,)  # copied without mapping its argument: still the other graph's node
    with pytest.raises(RuntimeError, match="does not belong to this Graph"):
        graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def used_after_erased():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.relu, (x,))
    graph.output(graph.call_function(torch.neg, (relu,)))
    relu.users.clear()  # as a pass that forgot to rewire its users would leave it
    graph.erase_node(relu)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def relu_graph(after_output=()):
    """x -> relu -> output, then ``after_output`` nodes appended after the output."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.relu, (x,)))
    for op, target in after_output:
        graph.create_node(op, target, (x,) if op != "output" else (x,))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def without_output():
    gm = relu_graph()
    gm.graph.erase_node(next(n for n in gm.graph.nodes if n.op == "output"))
    return gm


def call_module_of_a_tensor():
    model = torch.nn.Module()
    model.register_buffer("scale", torch.ones(2))
    graph = torch.fx.Graph()
    graph.output(graph.create_node("call_module", "scale", (graph.placeholder("x"),)))
    return torch.fx.GraphModule(model, graph)


def target_not_callable():
    gm = traced(lambda self, x: torch.relu(x))
    next(n for n in gm.graph.nodes if n.op == "call_function").target = 42
    return gm


def unknown_node_kind():
    gm = traced(lambda self, x: torch.relu(x))
    next(n for n in gm.graph.nodes if n.op == "call_function").op = "call_everything"
    return gm


def sparse():
    return torch.eye(2).to_sparse()


X = fxprop.TensorSpec((3, 2))

# (id, make the call, error, match): the call is a lambda returning (graph module or not, inputs, options).
PROPAGATE_TABLE = [
    ("a module, not a GraphModule", lambda: (torch.nn.Linear(2, 2), (X,), {}), fxprop.InputError,
     r"expects a torch.fx.GraphModule, got Linear \(trace a module first"),
    ("a bare Graph", lambda: (linear().graph, (X,), {}), fxprop.InputError, r"got Graph \(wrap a bare Graph"),
    ("a function", lambda: (print, (X,), {}), fxprop.InputError, r"expects a torch.fx.GraphModule, got builtin"),
    ("too many inputs", lambda: (linear(), (X, X), {}), fxprop.InputError, r"takes 1 inputs \(input_1\), got 2"),
    ("too few inputs", lambda: (linear(), (), {}), fxprop.InputError, r"takes 1 inputs \(input_1\), got 0"),
    ("a numpy array", lambda: (linear(), (np.zeros((3, 2), np.float32),), {}), fxprop.InputError,
     r"input 0 \(placeholder %input_1\): unsupported input type numpy.ndarray.*torch.from_numpy"),
    ("an object nested in a list", lambda: (traced(lambda self, xs: xs[0]), ([X, object()],), {}), fxprop.InputError,
     r"input 0 \(placeholder %xs\)\[1\]: unsupported input type builtins.object"),
    ("a sparse tensor", lambda: (linear(), (sparse(),), {}), fxprop.InputError, r"only strided tensors"),
    ("None where a tensor is needed", lambda: (linear(), (None,), {}), fxprop.PropagationError,
     r"(?s)must be Tensor, not NoneType.*while propagating node %linear"),
    ("a string where a tensor is needed", lambda: (linear(), ("x",), {}), fxprop.PropagationError,
     r"(?s)must be Tensor, not str.*while propagating node %linear"),
    ("a negative fallback limit", lambda: (linear(), (X,), {"fallback_limit_bytes": -1}), fxprop.InputError,
     r"fallback_limit_bytes must be a non-negative int, got -1"),
    ("an unknown param_device", lambda: (linear(), (X,), {"param_device": "gpu"}), fxprop.InputError,
     r"unknown device 'gpu'"),
    ("a cache that is not a RuleCache", lambda: (linear(), (X,), {"cache": {}}), fxprop.InputError,
     r"cache must be True, False, 'verify' or a fxprop.RuleCache, got dict"),
    ("get_attr on a missing attribute", lambda: (with_buffer_removed(), (X,), {}), fxprop.PropagationError,
     r"(?s)get_attr: the module has no attribute 'scale'.*while propagating node %scale"),
    ("call_module to a missing submodule", lambda: (with_submodule_removed(), (X,), {}), fxprop.PropagationError,
     r"(?s)call_module: the module has no submodule '0'.*while propagating node %_0"),
    ("a node used before it is defined", lambda: (used_before_defined(), (X,), {}), fxprop.PropagationError,
     r"(?s)node %relu is used before it is defined.*while propagating node %neg"),
    ("a node from another graph", lambda: (from_another_graph(), (X,), {}), fxprop.PropagationError,
     r"(?s)node %relu belongs to another graph \(copy nodes with Graph.node_copy.*while propagating node %neg"),
    ("a node used after it was erased", lambda: (used_after_erased(), (X,), {}), fxprop.PropagationError,
     r"(?s)node %relu was erased from the graph but is still used.*while propagating node %neg"),
    ("a graph without an output node", lambda: (without_output(), (X,), {}), fxprop.InputError,
     r"the graph has no output node: a graph ends in one, e.g. graph.output\(value\)"),
    ("two output nodes", lambda: (relu_graph([("output", "output")]), (X,), {}), fxprop.InputError,
     r"the graph has 2 output nodes \(%output \(output output\), %output_1 \(output output\)\): a graph "
     r"returns at its first output"),
    ("a node after the output", lambda: (relu_graph([("call_function", torch.neg)]), (X,), {}), fxprop.InputError,
     r"node %neg \(call_function .*neg\) comes after the graph's output node %output: .* would never run"),
    ("call_module of a tensor", lambda: (call_module_of_a_tensor(), (X,), {}), fxprop.PropagationError,
     r"(?s)call_module: the module has no submodule 'scale' \(`scale` is not an nn.Module\).*while propagating "
     r"node %scale"),
    ("call_method of a method tensors lack", lambda: (traced(lambda self, x: x.no_such_method()), (X,), {}),
     fxprop.PropagationError, r"(?s)AttributeError: 'Tensor' object has no attribute 'no_such_method'"
                              r".*while propagating node %no_such_method \(call_method Tensor.no_such_method\)"),
    ("a target that is not callable", lambda: (target_not_callable(), (X,), {}), fxprop.PropagationError,
     r"(?s)call_function target 42 is not callable.*while propagating node %relu"),
    ("an unknown node kind", lambda: (unknown_node_kind(), (X,), {}), fxprop.PropagationError,
     r"unknown node kind 'call_everything'"),
    ("a fallback over the memory cap", lambda: (traced(lambda self, x: torch.geqrf(x)),
                                                (fxprop.TensorSpec((10**6, 10**6)),), {}),
     fxprop.FallbackLimitError, r"(?s)would need 4,000,000,000,000 bytes \(its inputs\), over the fallback limit.*%geqrf"),
    ("a NaN used as a size", lambda: (traced(lambda self, x, n: x.new_zeros(n)), (X, math.nan), {}),
     fxprop.PropagationError, r"(?s)must be tuple of ints, not float.*while propagating node %new_zeros.*arg1: nan"),
    ("an inf used as a size", lambda: (traced(lambda self, x, n: torch.zeros((n, 2))), (X, math.inf), {}),
     fxprop.PropagationError, r"(?s)zeros\(\).*while propagating node %zeros.*arg0: \(inf, 2\)"),
    ("an inf in a view's shape", lambda: (traced(lambda self, x, n: x.view(n, -1)), (X, -math.inf), {}),
     fxprop.PropagationError, r"(?s)view\(\).*while propagating node %view"),
]


@pytest.mark.parametrize("make, error, match", [entry[1:] for entry in PROPAGATE_TABLE],
                         ids=[entry[0] for entry in PROPAGATE_TABLE])
def test_propagate_refuses(make, error, match):
    gm, inputs, options = make()
    nodes = list(gm.graph.nodes) if isinstance(gm, torch.fx.GraphModule) else []
    with assert_no_side_effects(gm if isinstance(gm, torch.nn.Module) else torch.nn.Module(), *inputs):
        with pytest.raises(error, match=match):
            fxprop.propagate(gm, *inputs, **options)
    assert all("fxprop" not in node.meta and "val" not in node.meta for node in nodes), "metadata was written"
    assert not isinstance(gm, torch.fx.GraphModule) or "fxprop" not in gm.meta, "the graph's summary was written"


SPEC_TABLE = [
    ("a negative dim", lambda: fxprop.TensorSpec((2, -1)), r"dims must be non-negative, got -1 in shape \(2, -1\)"),
    ("a float dim", lambda: fxprop.TensorSpec((2, 2.0)), r"dims must be non-negative ints, got 2.0"),
    ("a NaN dim", lambda: fxprop.TensorSpec((math.nan,)), r"dims must be non-negative ints, got nan"),
    ("an inf dim", lambda: fxprop.TensorSpec((math.inf, 2)), r"dims must be non-negative ints, got inf"),
    ("a bool dim", lambda: fxprop.TensorSpec((True, 2)), r"dims must be non-negative ints, got True"),
    ("a shape that is an int", lambda: fxprop.TensorSpec(3), r"shape must be a sequence of dims, got 3"),
    ("a shape that is a string", lambda: fxprop.TensorSpec("2x3"), r"shape must be a sequence of dims"),
    ("a stride of the wrong length", lambda: fxprop.TensorSpec((2, 3), stride=(1,)),
     r"stride \(1,\) must hold one non-negative int per dim of shape \(2, 3\)"),
    ("a negative stride", lambda: fxprop.TensorSpec((2, 3), stride=(3, -1)), r"stride .* non-negative int"),
    ("an unknown dtype string", lambda: fxprop.TensorSpec((2,), dtype="float33"),
     r"unknown dtype 'float33': expected a torch dtype name such as 'float32'"),
    ("a dtype that is not a dtype", lambda: fxprop.TensorSpec((2,), dtype=np.float32),
     r"expected a torch.dtype or a dtype name, got type"),
    ("a dtype name that is not a dtype", lambda: fxprop.TensorSpec((2,), dtype="nn"), r"unknown dtype 'nn'"),
    ("an unknown device string", lambda: fxprop.TensorSpec((2,), device="gpu:0"), r"unknown device 'gpu:0'"),
    ("a negative device index", lambda: fxprop.TensorSpec((2,), device="cuda:-1"), r"unknown device 'cuda:-1'"),
    ("a negative device number", lambda: fxprop.TensorSpec((2,), device=-1),
     r"a device index must be non-negative, got -1"),
    ("a device that is not a device", lambda: fxprop.TensorSpec((2,), device=1.5),
     r"expected a device \(torch.device, str or int\), got float"),
    ("requires_grad on integers", lambda: fxprop.TensorSpec((2,), dtype=torch.int64, requires_grad=True),
     r"only floating point and complex tensors can require gradients, got torch.int64"),
    ("requires_grad that is not a bool", lambda: fxprop.TensorSpec((2,), requires_grad=1),
     r"requires_grad must be a bool, got 1"),
]


@pytest.mark.parametrize("make, match", [entry[1:] for entry in SPEC_TABLE], ids=[entry[0] for entry in SPEC_TABLE])
def test_tensor_spec_refuses(make, match):
    with pytest.raises(fxprop.InputError, match=match):
        make()


def test_input_errors_are_type_and_value_errors():
    """Callers that catch the builtin categories keep working."""
    assert issubclass(fxprop.InputError, TypeError) and issubclass(fxprop.InputError, ValueError)


def test_a_node_after_the_output_is_named_with_its_source_line():
    gm = relu_graph([("call_function", torch.neg)])
    dead = next(n for n in gm.graph.nodes if n.name == "neg")
    dead.stack_trace = 'File "model.py", line 7, in forward\n    y = -x'
    with pytest.raises(fxprop.InputError, match=r'node %neg \(call_function .*neg, File "model.py", line 7: y = -x\) '
                                                 r"comes after the graph's output node %output"):
        fxprop.propagate(gm, X)


def wire_a_node_of_another_graph(gm):
    other = torch.fx.Graph()
    foreign = other.call_function(torch.neg, (other.placeholder("a"),))
    mul = next(n for n in gm.graph.nodes if n.name == "mul")
    mul.args = (foreign, 2)
    return [mul]


def append_after_the_output(gm):
    gm.graph.call_function(torch.neg, (next(iter(gm.graph.nodes)),))
    return []  # a new node: repropagate finds it unannotated


@pytest.mark.parametrize("edit, error, match", [
    (wire_a_node_of_another_graph, fxprop.PropagationError, r"(?s)node %neg belongs to another graph.*%mul"),
    (append_after_the_output, fxprop.InputError, r"node %neg .* comes after the graph's output node %output"),
], ids=["a node of another graph", "a node after the output"])
def test_repropagate_refuses_a_malformed_edit_and_changes_nothing(edit, error, match):
    gm = traced(lambda self, x: torch.relu(x) * 2)
    fxprop.propagate(gm, X)
    edited = edit(gm)
    before, summary = {node.name: dict(node.meta) for node in gm.graph.nodes}, dict(gm.meta)
    with pytest.raises(error, match=match):
        fxprop.repropagate(gm, edited)
    assert {node.name: dict(node.meta) for node in gm.graph.nodes} == before and gm.meta == summary


# What must *not* be refused.

def test_a_placeholder_after_other_nodes_takes_its_input_in_graph_order():
    """torch.fx binds placeholders in graph order wherever they stand; so does fxprop."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    relu = graph.call_function(torch.relu, (x,))
    y = graph.placeholder("y")
    graph.output(graph.call_function(torch.add, (relu, y)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert_matches_real(gm, fxprop.TensorSpec((3, 1)), fxprop.TensorSpec((1, 4), dtype=torch.float64))
    assert gm.graph.find_nodes(op="output")[0].meta["val"].shape == (3, 4)


def test_meta_tensors_of_a_trillion_elements_propagate():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(10**6, 8), torch.nn.ReLU()))
    with assert_no_side_effects(gm):
        out = fxprop.propagate(gm, fxprop.TensorSpec((10**6, 10**6)))
    assert tuple(out.shape) == (10**6, 8)
    assert gm.meta["fxprop"]["fallback_bytes"] == 0


def test_huge_linear_on_huge_input():
    gm = traced(lambda self, x, w: torch.nn.functional.linear(x, w))
    out = fxprop.propagate(gm, fxprop.TensorSpec((10**6, 10**6)), fxprop.TensorSpec((10**6, 10**6)))
    assert tuple(out.shape) == (10**6, 10**6)


def test_a_raised_fallback_cap_is_honoured():
    gm = traced(lambda self, x: torch.geqrf(x))
    with pytest.raises(fxprop.FallbackLimitError, match="over the fallback limit of 16 bytes"):
        fxprop.propagate(gm, fxprop.TensorSpec((3, 3)), fallback_limit_bytes=16)
    out = fxprop.propagate(gm, fxprop.TensorSpec((3, 3)))
    assert tuple(out[0].shape) == (3, 3) and gm.meta["fxprop"]["fallback_bytes"] > 0


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_scalars_as_op_arguments_propagate(value):
    gm = traced(lambda self, x, v: (x.masked_fill(x > 0, v) * v + v, torch.full((2,), v), torch.clamp(x, min=v)))
    out = fxprop.propagate(gm, fxprop.TensorSpec((2, 3), dtype=torch.float16), value)
    assert [tuple(t.shape) for t in out] == [(2, 3), (2,), (2, 3)]
    assert out[0].dtype == torch.float16 and out[1].dtype == torch.float32


def test_none_for_an_optional_placeholder_is_legitimate():
    """None is a value like any other: an op that takes an optional tensor accepts it."""
    gm = traced(lambda self, x, bias: torch.nn.functional.linear(x, torch.ones(4, 2), bias))
    assert tuple(fxprop.propagate(gm, X, None).shape) == (3, 4)
