"""Errors name the node, its op, its inputs and the user's source line; nothing is half-written."""
import pytest
import torch

import fxprop


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return y @ torch.ones(5, 2)


def traced_with_stack_traces(model):
    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = True
    graph = tracer.trace(model)
    return torch.fx.GraphModule(model, graph)


def test_shape_error_names_node_inputs_and_source_line():
    gm = traced_with_stack_traces(Broken())
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, fxprop.TensorSpec((3, 8)))
    error = caught.value
    assert error.node_name == "matmul"
    message = str(error)
    assert "%matmul" in message and "shape=(3, 4)" in message and "shape=(5, 2)" in message
    assert "test_errors.py" in message and "y @ torch.ones(5, 2)" in message
    assert isinstance(error.__cause__, RuntimeError)


def test_an_error_describes_a_storage_of_symbolic_size_among_its_inputs():
    """A storage's repr reads its size as an int, which C++ refuses for a symbolic one: describing the
    inputs raised that instead of the node's error. Setting a tensor to a storage of symbolic size is
    refused so, as torch's own FakeTensor run of the graph refuses it."""
    def set_to_storage(x):
        return x.new_empty(0).set_(torch.nn.functional.layer_norm(x, (8,)).untyped_storage())
    gm = torch.fx.symbolic_trace(set_to_storage)
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, fxprop.TensorSpec(("B", 8)))
    assert caught.value.node_name == "set_"
    assert "UntypedStorage(nbytes=32*B)" in str(caught.value)


def test_failed_propagate_leaves_metadata_as_it_was():
    gm = torch.fx.symbolic_trace(Broken())
    fxprop.propagate(gm, fxprop.TensorSpec((3, 8)), ) if False else None
    before = {n.name: dict(n.meta) for n in gm.graph.nodes}
    with pytest.raises(fxprop.PropagationError):
        fxprop.propagate(gm, fxprop.TensorSpec((3, 8)))
    assert {n.name: dict(n.meta) for n in gm.graph.nodes} == before


def test_a_kernel_that_refuses_the_meta_device_is_fxprops_limit_not_the_models():
    """A strided nested tensor's kernel asserts that its storage is on a real device ("... but got
    meta"): real execution succeeds, so the node is unsupported, not the model's error."""
    import operator
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nested = graph.call_function(torch.nested.as_nested_tensor,
                                 ([x, graph.call_function(operator.getitem, (x, slice(0, 2)))],), {"layout": torch.strided})
    graph.output((nested,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.warns(UserWarning, match="nested tensors is in prototype"):
        gm(torch.randn(4, 8))  # real execution makes it
        with pytest.raises(fxprop.UnsupportedError, match="but got meta"):
            fxprop.propagate(gm, torch.randn(4, 8))
