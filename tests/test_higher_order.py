"""Higher-order ops: graphs holding them propagate, and their subgraphs' own nodes are annotated.

Each graph is built the way a pipeline builds it (torch.export, or dynamo's capture where only
torch.compile emits the op) and checked node by node, subgraph nodes included, against a real
run: shape, dtype, device, strides and requires_grad. A subgraph's nodes are compared with the
values they took when torch's eager kernel called it (the first call, for a loop); a subgraph the
real run never called on real tensors (cond's branch not taken, a body torch's autograd kernel
traced instead of calling) is run on what that kernel would have handed it, under no_grad as
torch's autograd Functions run their subgraphs.
"""
from __future__ import annotations

import contextlib
import copy
import io
import operator
import warnings

import pytest
import torch
import torch.fx

import fxprop
from fxprop.testing import compare_nodes, observe, real_value, render_mismatches
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch._subclasses.fake_tensor import FakeTensor

warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=FutureWarning)

hop = torch.ops.higher_order


# --- running for real, subgraphs included ------------------------------------------------------

def _is_real(value) -> bool:
    return not any(isinstance(leaf, FakeTensor) for leaf in torch.utils._pytree.tree_leaves(value))


class _Recorder(torch.fx.Interpreter):
    """Records each node's first real value, and each higher-order op's real call."""

    def __init__(self, gm, prefix, book, hop_calls):
        super().__init__(gm)
        self.prefix, self.book, self.hop_calls = prefix, book, hop_calls

    def run_node(self, node):
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            if _is_real((args, kwargs)):
                autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
                self.hop_calls.append((node.target, args, kwargs, torch.is_grad_enabled(), autocast))
        result = super().run_node(node)
        if _is_real(result) and not isinstance(result, torch.nn.Module):
            self.book.setdefault(self.prefix, {}).setdefault(node.name, observe(result))
        return result


def _subgraph_path(gm, module) -> str:
    for name, sub in gm.named_modules():
        if sub is module:
            return name + "."
    raise AssertionError("subgraph not found")


def _reference_calls(target, args, kwargs, grad_enabled):
    """What torch's eager kernel hands each subgraph: (subgraph, inputs, grad mode, replaces the real run's
    record). Subgraphs that torch runs inside an autograd Function run without grad. invoke_subgraph's
    subgraph is compared as the call it stands for (torch's Function only hides its grad; its results'
    requires_grad follows the subgraph's with-grad annotation), the last call's values winning; associative_scan's
    combine_fn as torch traces it, on one element of each side."""
    if target is hop.cond:
        pred, true_fn, false_fn, operands = args
        return [(true_fn, operands, False, False), (false_fn, operands, False, False)]
    if target is hop.while_loop:
        cond_fn, body_fn, carried, additional = args
        return [(cond_fn, [*carried, *additional], False, False), (body_fn, [*carried, *additional], False, False)]
    if target is hop.map_impl:
        f, xs, pos = args
        return [(f, [*(x[0] for x in xs), *pos], False, False)]
    if target is hop.scan:
        combine, init, xs, additional = args
        return [(combine, [*init, *(x[0] for x in xs), *additional], False, False)]
    if target is hop.flex_attention:
        query, key, value, score_mod, block_mask, scale, options, score_buffers, mask_buffers = args
        working = torch.float64 if query.dtype == torch.float64 else torch.float32
        indices = [torch.zeros((), dtype=torch.int64) for _ in range(4)]
        return [(score_mod, [torch.zeros((), dtype=working), *indices, *score_buffers], False, False),
                (block_mask[-1], [*indices, *mask_buffers], False, False)]
    if target is hop.associative_scan:  # torch's kernel combines whole chunks; its trace, one element of each
        combine, xs, additional = args
        return [(combine, [*(x[0] for x in xs), *(x[0] for x in xs), *additional], False, True)]
    if target in (hop.tag_activation_checkpoint, hop.wrap_activation_checkpoint):
        return [(args[0], args[1:], grad_enabled, False)]
    if target is hop.invoke_subgraph:
        return [(args[0], args[2:], grad_enabled, True)]
    return []


def run_real(gm, *inputs):
    """Run a copy of ``gm`` for real; {subgraph path: {node name: observed value}}."""
    gm = copy.deepcopy(gm)
    book, hop_calls = {}, []
    for name, sub in gm.named_modules():
        if isinstance(sub, torch.fx.GraphModule) and name:
            sub.forward = lambda *args, _sub=sub, _name=name: _Recorder(_sub, _name + ".", book, hop_calls).run(*args)
    _Recorder(gm, "", book, hop_calls).run(*inputs)
    for target, args, kwargs, grad_enabled, autocast in hop_calls:
        for subgraph, sub_inputs, grad, replace in _reference_calls(target, args, kwargs, grad_enabled):
            path = _subgraph_path(gm, subgraph)
            if replace:
                book.pop(path, None)
            if path not in book:
                with torch.set_grad_enabled(grad), torch.autocast("cpu", autocast, enabled=autocast is not None):
                    subgraph(*sub_inputs)
    return book


def check_against_real(gm, *inputs, **options):
    """Propagate ``gm`` and compare every node, the subgraphs' too, with a real run."""
    real_inputs = real_value(inputs, generator=torch.Generator().manual_seed(0))
    with fxprop.testing.assert_no_side_effects(gm, *inputs):
        out = fxprop.propagate(gm, *inputs, **options)
    book = run_real(gm, *real_inputs)
    mismatches, compared = [], 0
    for name, sub in gm.named_modules():
        if isinstance(sub, torch.fx.GraphModule):
            observed = book.get(name + "." if name else "")
            assert observed is not None, f"the real run never reached subgraph {name!r}"
            mismatches += compare_nodes(sub, observed)
            compared += 1
            unannotated = [n.name for n in sub.graph.nodes if "fxprop" not in n.meta]
            assert not unannotated, f"nodes of {name or 'the graph'} left unannotated: {unannotated}"
    if mismatches:
        raise AssertionError(render_mismatches(mismatches))
    return out


def exported(module, *args):
    """``torch.export.export(module, args).module()``, without the call that checks inputs against the
    example's shapes (a pipeline that propagates other shapes drops it)."""
    gm = torch.export.export(module, args).module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def provenance(gm, path, name):
    sub = gm.get_submodule(path) if path else gm
    return next(n for n in sub.graph.nodes if n.name == name).meta["fxprop"]


def val(gm, path, name):
    sub = gm.get_submodule(path) if path else gm
    return next(n for n in sub.graph.nodes if n.name == name).meta["val"]


# --- grad mode ----------------------------------------------------------------------------------

class NoGradBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            f = x * 2
            g = self.lin(f)
        return self.lin(f) + g


def test_no_grad_block():
    gm = exported(NoGradBlock(), torch.randn(2, 8))
    out = check_against_real(gm, torch.randn(2, 8))
    assert out.shape == (2, 8) and out.requires_grad
    body = next(n for n in gm.graph.nodes if n.target is hop.wrap_with_set_grad_enabled)
    assert [v.requires_grad for v in body.meta["val"]] == [False, False]


def test_a_no_grad_block_that_feeds_a_linear_layer():
    class M(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.lin = torch.nn.Linear(8, 8)

        def forward(s, x):
            with torch.no_grad():
                f = x * 2
            return s.lin(f)
    gm = exported(M(), torch.randn(2, 8))
    out = fxprop.propagate(gm, torch.randn(2, 8))
    assert out.shape == (2, 8) and out.requires_grad
    assert val(gm, "submod_1", "mul").shape == (2, 8)


# --- autocast -----------------------------------------------------------------------------------

class Autocast(torch.nn.Module):
    def __init__(self, device_type="cpu", dtype=torch.bfloat16):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.device_type, self.dtype = device_type, dtype

    def forward(self, x, w):
        outside = self.lin(x)
        with torch.autocast(self.device_type, dtype=self.dtype):
            y = self.lin(x)
            z = torch.softmax(y, -1) + self.norm(y)
            e = torch.einsum("ij,jk->ik", x, w)
            m = y @ w
            c = torch.cat([y, x], 1)
        return outside, y, z, e, m, c


def test_autocast_cpu_casts_as_torch_does():
    gm = exported(Autocast(), torch.randn(2, 8), torch.randn(8, 8))
    out = check_against_real(gm, torch.randn(2, 8), torch.randn(8, 8))
    assert [o.dtype for o in out] == [torch.float32, torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.bfloat16,
                                      torch.float32]
    assert out[1].requires_grad


def test_autocast_cache_entries_are_kept_apart_from_the_same_call_outside():
    gm = exported(Autocast(), torch.randn(2, 8), torch.randn(8, 8))
    for _ in range(2):  # the second run hits the cache
        out = fxprop.propagate(gm, torch.randn(2, 8), torch.randn(8, 8))
        assert out[0].dtype == torch.float32 and out[1].dtype == torch.bfloat16


def test_autocast_cuda_follows_torchs_cuda_lists():
    """No CUDA here: the casts come from torch's own CUDA autocast kernels, run on FakeTensors."""
    gm = exported(Autocast("cpu", torch.bfloat16), torch.randn(2, 8), torch.randn(8, 8))
    body = next(n for n in gm.graph.nodes if n.target is hop.wrap_with_autocast)
    body.args = ("cuda", torch.float16, *body.args[2:])
    gm.recompile()
    gm.to("meta")
    cuda = fxprop.TensorSpec((2, 8), device="cuda:0")
    out = fxprop.propagate(gm, cuda, fxprop.TensorSpec((8, 8), device="cuda:0"), param_device="cuda:0")
    sub = gm.get_submodule(body.args[4].target)
    dtypes = {n.name: n.meta["val"].dtype for n in sub.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert dtypes["linear_1"] == torch.float16  # lower precision on CUDA and CPU alike
    assert dtypes["softmax"] == torch.float32  # CUDA's fp32 list (CPU leaves softmax alone)
    assert dtypes["layer_norm"] == torch.float32
    assert dtypes["einsum"] == torch.float16  # CUDA casts einsum itself
    assert dtypes["cat"] == torch.float32  # promoted to the widest input, as on the CPU
    assert [o.device for o in out] == [torch.device("cuda:0")] * 6


def test_autocast_disabled_inside_autocast():
    class M(torch.nn.Module):
        def forward(self, x, w):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                a = x @ w
                with torch.autocast("cpu", enabled=False):
                    b = x @ w
            return a, b
    gm = exported(M(), torch.randn(2, 8), torch.randn(8, 8))
    out = check_against_real(gm, torch.randn(2, 8), torch.randn(8, 8))
    assert [o.dtype for o in out] == [torch.bfloat16, torch.float32]


# --- cond ---------------------------------------------------------------------------------------

class Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: (self.lin(x).sin(), x.long()), lambda x: (x.cos(), x.long() + 1),
                          (x,))


def test_cond_on_data_propagates_both_branches():
    gm = exported(Cond(), torch.randn(2, 4))
    out = check_against_real(gm, torch.randn(2, 4))
    assert out[0].requires_grad and not out[1].requires_grad  # as autograd.Function outputs
    assert not val(gm, "true_graph_0", "sin").requires_grad  # the branches run without grad
    assert val(gm, "false_graph_0", "cos").shape == (2, 4)


def test_cond_branches_of_different_sizes_give_a_fresh_symbol():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: x[:2].sin(), lambda x: x.cos(), (x,))
    gm = exported(M(), torch.randn(3, 4))
    out = check_against_real(gm, torch.randn(3, 4))
    rows = fxprop.shape_of(next(n for n in gm.graph.nodes if n.op == "output"))[0][0]
    assert str(rows).startswith("u") and out.shape[1] == 4
    symbol = gm.meta["fxprop"]["symbols"][rows]
    assert (symbol.lower, symbol.upper) == (2, 3)


def test_cond_with_symbolic_inputs():
    gm = exported(Cond(), torch.randn(2, 4))
    fxprop.propagate(gm, fxprop.TensorSpec(("B", 4)))
    assert str(fxprop.shape_of(next(n for n in gm.graph.nodes if n.name == "getitem"))) == "(B, 4)"
    assert str(fxprop.shape_of(next(n for n in gm.true_graph_0.graph.nodes if n.name == "sin"))) == "(B, 4)"


def _graph_calling(target, subgraphs: dict, n_inputs: int, make_args):
    """A graph whose one node calls ``target`` with get_attr'd subgraphs, as export lays it out."""
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    inputs = [graph.placeholder(f"x{i}") for i in range(n_inputs)]
    attrs = {}
    for name, sub in subgraphs.items():
        root.add_module(name, sub)
        attrs[name] = graph.get_attr(name)
    node = graph.call_function(target, make_args(inputs, attrs))
    graph.output(node)
    return torch.fx.GraphModule(root, graph)


def _traced(fn):
    return torch.fx.symbolic_trace(fn)


@pytest.mark.parametrize("false_fn, what", [
    (lambda x: (x.long(),), "dtype"),
    (lambda x: (x.unsqueeze(0),), "dim"),
    (lambda x: (x, x), "spec"),
])
def test_cond_branches_that_disagree_are_refused(false_fn, what):
    gm = _graph_calling(hop.cond, {"t": _traced(lambda x: (x.sin(),)), "f": _traced(false_fn)}, 2,
                        lambda xs, g: (xs[0], g["t"], g["f"], (xs[1],)))
    with pytest.raises(fxprop.PropagationError, match=what) as caught:
        fxprop.propagate(gm, torch.tensor(True), torch.randn(3))
    assert caught.value.error_type is RuntimeError  # as torch's cond refuses them


# --- loops ----------------------------------------------------------------------------------------

class While(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, i, x):
        return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * self.w), (i, x))


def test_while_loop():
    gm = exported(While(), torch.tensor(0), torch.randn(4))
    out = check_against_real(gm, torch.tensor(0), torch.randn(4))
    assert out[1].requires_grad and not out[0].requires_grad


def test_while_loop_body_that_is_not_a_fixed_point_is_refused():
    gm = _graph_calling(hop.while_loop, {"c": _traced(lambda i, x: i < 3), "b": _traced(lambda i, x: (i + 1, x.sum()))},
                        2, lambda xs, g: (g["c"], g["b"], (xs[0], xs[1]), ()))
    with pytest.raises(fxprop.PropagationError, match=r"shape: \(4,\) vs \(\)") as caught:
        fxprop.propagate(gm, torch.tensor(0), torch.randn(4))
    assert caught.value.error_type is RuntimeError


def test_map():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, xs, y):
            return hop_map(lambda x, y: (x * self.w + y, (x * 2).t()), xs, y)
    gm = exported(M(), torch.randn(3, 4, 4), torch.randn(4))
    out = check_against_real(gm, torch.randn(3, 4, 4), torch.randn(4))
    assert out[0].shape == (3, 4, 4) and out[0].requires_grad


def test_scan():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, init, xs):
            return scan(lambda c, x: (c + x * self.w, (c * 2).sum(0)), init, xs)
    gm = exported(M(), torch.randn(2, 4), torch.randn(5, 2, 4))
    out = check_against_real(gm, torch.randn(2, 4), torch.randn(5, 2, 4))
    assert [tuple(o.shape) for o in out] == [(2, 4), (5, 4)]


class ZeroLengthLoops(torch.nn.Module):
    def __init__(self, loop):
        super().__init__()
        self.loop = loop

    def forward(self, xs, w):
        if self.loop == "scan":
            return scan(lambda c, x: (c @ w + x, (c @ w).sum()), torch.zeros(xs.shape[1], w.shape[1]), xs)
        return hop_map(lambda x, w: torch.tanh(x @ w), xs, w)


@pytest.mark.parametrize("loop", ["scan", "map"])
def test_a_loop_over_a_leading_dim_of_size_0_is_refused_as_real_execution_refuses_it(loop):
    """Adversary finding: exported with a dynamic length and run on an empty one, torch's kernels
    refuse (scan selects step 0; map has no result to take its structure from); fxprop propagated."""
    ep = torch.export.export(ZeroLengthLoops(loop), (torch.randn(5, 4, 4), torch.randn(4, 4)),
                             dynamic_shapes=({0: torch.export.Dim("T", min=2)}, None))
    gm = ep.module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    gm.recompile()
    inputs = (torch.randn(0, 4, 4), torch.randn(4, 4))
    with pytest.raises(Exception) as real:
        gm(*inputs)
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, *inputs)
    assert caught.value.error_type is type(real.value)
    fxprop.propagate(gm, torch.randn(3, 4, 4), torch.randn(4, 4))  # a length of 1 or more propagates


# --- calls of subgraphs: checkpointing, compiled regions ----------------------------------------

def _captured(module, *args):
    """The FX graph dynamo hands a backend (where torch.compile, not export, emits the op)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    torch.compile(module, backend=backend, fullgraph=True)(*args)
    return graphs[-1]


def test_tag_activation_checkpoint():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(lambda x: self.lin(x).relu(), x, use_reentrant=False)
    module = M()
    gm = _captured(module, torch.randn(2, 8))
    assert any(n.target is hop.tag_activation_checkpoint for n in gm.graph.nodes)
    out = check_against_real(gm, torch.randn(2, 8), module.lin.weight, module.lin.bias)
    assert out[0].requires_grad


def test_invoke_subgraph_called_twice():
    block = _traced(lambda x, w: (torch.nn.functional.linear(x, w).relu(),))
    gm = _graph_calling(hop.invoke_subgraph, {"repeated_subgraph0": block}, 2,
                        lambda xs, g: (g["repeated_subgraph0"], "subgraph_0", xs[0], xs[1]))
    first = next(n for n in gm.graph.nodes if n.target is hop.invoke_subgraph)
    with gm.graph.inserting_after(first):
        item = gm.graph.call_function(operator.getitem, (first, 0))
    with gm.graph.inserting_after(item):
        second = gm.graph.call_function(hop.invoke_subgraph, (first.args[0], "subgraph_0", item, first.args[3]))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.args = (second,)
    gm.recompile()
    w = torch.randn(8, 8, requires_grad=True)
    out = check_against_real(gm, torch.randn(2, 8), w)
    assert out[0].requires_grad and out[0].shape == (2, 8)


# --- functionalized mutation and effects --------------------------------------------------------

@torch.library.custom_op("fxprop_hop_test::add_one_", mutates_args=("x",))
def _add_one_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return y * 2


@_add_one_.register_fake
def _(x, y):
    return torch.empty_like(y)


def test_auto_functionalized_v2():
    class M(torch.nn.Module):
        def forward(self, x, y):
            x = x.clone()
            z = torch.ops.fxprop_hop_test.add_one_(x[:, 1:], y)
            return x + 1, z
    ep = torch.export.export(M(), (torch.randn(3, 4), torch.randn(2)))
    gm = ep.run_decompositions({}).module()
    assert any(n.target is hop.auto_functionalized_v2 for n in gm.graph.nodes)
    check_against_real(gm, torch.randn(3, 4), torch.randn(2))


def test_auto_functionalized():
    gm = _graph_calling(hop.auto_functionalized, {}, 2, lambda xs, g: (torch.ops.fxprop_hop_test.add_one_.default,))
    node = next(n for n in gm.graph.nodes if n.target is hop.auto_functionalized)
    node.kwargs = {"x": node.graph.find_nodes(op="placeholder")[0], "y": node.graph.find_nodes(op="placeholder")[1]}
    gm.recompile()
    out = check_against_real(gm, torch.randn(3, 4).t(), torch.randn(2))
    assert out[1].stride() == (1, 4)  # the clone keeps the mutated argument's strides


def test_with_effects():
    class M(torch.nn.Module):
        def forward(self, x):
            torch.ops.aten._print("hello")
            return x + 1
    ep = torch.export.export(M(), (torch.randn(3),)).run_decompositions({})
    gm = ep.graph_module
    assert any(n.target is hop.with_effects for n in gm.graph.nodes)
    token, out = check_against_real(gm, torch.tensor([]), torch.randn(3))
    assert token.shape == (0,) and out.shape == (3,)


def _aot_forward(fn, *args):
    """The forward graph AOT autograd hands a compiler (functionalized: mutations become
    auto_functionalized_v2, effects are ordered by tokens) and the inputs it is called with."""
    from torch._functorch.aot_autograd import aot_module_simplified
    captured = []

    def backend(gm, example_inputs):
        def forward_compiler(graph, inputs):
            captured.append((graph, list(inputs)))
            return graph
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward_compiler)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return captured[0]


def test_auto_functionalized_v2_of_a_compiled_region_that_mutates_its_input():
    @torch.compiler.nested_compile_region
    def region(x, buffer):
        buffer.add_(1)
        return x * 2

    gm, inputs = _aot_forward(lambda x, buffer: region(x, buffer) + region(x, buffer),
                              torch.randn(4, 4).t(), torch.zeros(4, 4))
    calls = [n for n in gm.graph.nodes if n.target is hop.auto_functionalized_v2]
    assert len(calls) == 2 and calls[0].args[0] is hop.invoke_subgraph
    check_against_real(gm, *inputs)
    assert all("val" in n.meta for n in gm.get_submodule(calls[0].kwargs["subgraph"].target).graph.nodes)


@pytest.mark.parametrize("which", [0, 1], ids=["input", "mutated_buffer"])
def test_auto_functionalized_v2_of_a_mutating_region_refuses_training_as_real_execution_does(which):
    """Adversary finding: with an input that requires grad, real execution refuses (the region
    mutates an input under autograd); fxprop propagated."""
    @torch.compiler.nested_compile_region
    def region(x, buffer):
        buffer.add_(1)
        return x * 2

    gm, inputs = _aot_forward(lambda x, buffer: region(x, buffer) + region(x, buffer), torch.randn(4, 4),
                              torch.zeros(4, 4))
    inputs = [t.clone().requires_grad_(i == which) for i, t in enumerate(inputs)]
    with pytest.raises(RuntimeError):
        gm(*[t.clone() if not t.requires_grad else t.detach().clone().requires_grad_() for t in inputs])
    with pytest.raises(fxprop.PropagationError) as caught:
        fxprop.propagate(gm, *inputs)
    assert caught.value.error_type is RuntimeError


def test_with_effects_of_the_print_op():
    from torch._higher_order_ops.print import print as hop_print

    def f(x):
        y = x * 2
        hop_print("y = {} and {name}", y, name=x.sum())
        return y + 1
    gm, inputs = _aot_forward(f, torch.randn(3))
    call = next(n for n in gm.graph.nodes if n.target is hop.with_effects)
    assert call.args[1] is hop.print
    token, out = check_against_real(gm, *inputs)
    assert token.shape == (0,) and out.shape == (3,)


PRINT_FORMATS = [  # (format, shapes of the positional tensors, of the keyword ones, dtype)
    ("{} {}", [(2,)], {}, torch.float32), ("{1}", [(2,)], {}, torch.float32), ("{} {}", [(2,), (2,)], {}, torch.float32),
    ("{0[1]}", [(2,)], {}, torch.float32), ("{0[7]}", [(3,)], {}, torch.float32), ("{n}", [], {"n": (2,)}, torch.float32),
    ("{name.real}", [(2,)], {}, torch.float32), ("{0.shape}", [(2,)], {}, torch.float32),
    ("{0.no_such_attribute}", [(2,)], {}, torch.float32), ("{x[0]}", [], {"x": (2,)}, torch.float32),
    ("{x[0]}", [], {"x": ()}, torch.float32), ("{:.2f}", [()], {}, torch.float32), ("{:.2f}", [(2,)], {}, torch.float32),
    ("{0:d}", [()], {}, torch.int64), ("{0:d}", [()], {}, torch.float32), ("{{}}", [], {}, torch.float32),
    ("{} {0}", [(2,)], {}, torch.float32), ("{0!x}", [(2,)], {}, torch.float32), ("{0:{3}}", [(2,)], {}, torch.float32),
    ("{", [], {}, torch.float32), ("}", [], {}, torch.float32), (5, [], {}, torch.float32),
    ("{0.shape[1]}", [(2, 3)], {}, torch.float32), ("{0.shape[2]}", [(2, 3)], {}, torch.float32),
    ("{0.real:.2f}", [()], {}, torch.float32), ("{0.T[5]}", [(2, 3)], {}, torch.float32),
    ("{0:{1.shape}}", [(2,), (2,)], {}, torch.float32), ("{x.dtype.is_signed}", [], {"x": (2,)}, torch.int32),
    ("{0.grad_fn}", [(2,)], {}, torch.float32), ("{0.device.index}", [(2,)], {}, torch.float32),
    # split as str.format splits fields (adversary findings)
    ("{x[0]junk}", [], {"x": (2,)}, torch.float32), ("{x.shape[0]z}", [], {"x": (2,)}, torch.float32),
    ("{x.}", [], {"x": (2,)}, torch.float32), ("{x[]}", [], {"x": (2,)}, torch.float32),
    ("{\u00b2}", [(2,)], {}, torch.float32), ("{99999999999999999999}", [(2,)], {}, torch.float32),
    ("{x._fxprop_device}", [], {"x": (2,)}, torch.float32),
]


@pytest.mark.parametrize("format_str,shapes,keyword_shapes,dtype", PRINT_FORMATS,
                         ids=[f"{f!r}-{len(a)}-{sorted(k)}-{d}" for f, a, k, d in PRINT_FORMATS])
def test_print_refuses_a_format_as_the_real_print_does(format_str, shapes, keyword_shapes, dtype, capfd):
    """Adversary findings: fields, attributes, indices, conversions and format specs are refused as
    real formatting refuses them, and a format that is not a string as the op's own assertion."""
    graph = torch.fx.Graph()
    xs = [graph.placeholder(f"x{i}") for i in range(len(shapes))]
    named = {name: graph.placeholder(name) for name in keyword_shapes}
    graph.output(graph.call_function(hop.print, (format_str, *xs), named))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    inputs = [torch.ones(shape, dtype=dtype) for shape in [*shapes, *keyword_shapes.values()]]
    try:
        gm(*inputs)
    except Exception as real:
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, *inputs)
        assert caught.value.error_type is type(real)
    else:
        capfd.readouterr()
        fxprop.propagate(gm, *inputs)
        assert capfd.readouterr().out == ""  # nothing is printed while propagating


def test_print_takes_on_trust_what_a_propagated_value_need_not_share():
    """Adversary finding: ``{y.grad_fn.name}`` of a computed tensor was refused, as a stand-in has
    no grad_fn; the real print formats it."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    graph.output(graph.call_function(hop.print, ("{0.grad_fn.name} {0.shape[0]}", y), {}))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    x = torch.randn(3, requires_grad=True)
    gm(x)
    fxprop.propagate(gm, x)


# --- nesting and errors ----------------------------------------------------------------------------

class CondLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: (self.lin(x).sin(), x.long()),
                          lambda x: (self.lin(x.cos()), x.long() + 1), (x,))


def test_cond_inside_autocast_and_no_grad_regions():
    autocast = _graph_calling(hop.wrap_with_autocast, {"body": exported(CondLinear(), torch.randn(2, 4))}, 1,
                              lambda xs, g: ("cpu", torch.bfloat16, True, False, g["body"], xs[0]))
    y, long = check_against_real(autocast, torch.randn(2, 4))
    assert y.dtype == torch.bfloat16 and y.requires_grad and long.dtype == torch.int64
    assert val(autocast, "body.false_graph_0", "cos").dtype == torch.float32  # cos is not cast
    no_grad = _graph_calling(hop.wrap_with_set_grad_enabled, {"body": exported(CondLinear(), torch.randn(2, 4))}, 1,
                             lambda xs, g: (False, g["body"], xs[0]))
    y, _ = check_against_real(no_grad, torch.randn(2, 4))
    assert not y.requires_grad


def test_an_autocast_region_spelled_as_enter_and_exit_nodes_casts_the_nodes_between():
    """torch.export spells an autocast block that holds a higher-order op as _enter_autocast and
    _exit_autocast nodes: the nodes between are cast as the block's body would be."""
    class M(torch.nn.Module):
        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = torch.cond(x.sum() > 0, lambda x: x @ x, lambda x: (x + 1) @ x, (x,))
                z = x @ x
            return y, z, x @ x
    gm = exported(M(), torch.randn(4, 4))
    assert any(n.target is torch.amp.autocast_mode._enter_autocast for n in gm.graph.nodes)
    y, z, outside = check_against_real(gm, torch.randn(4, 4))
    assert (y.dtype, z.dtype, outside.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_autocast_region_in_a_dynamo_graph_matches_dynamos_own_metadata(dynamic):
    """Adversary finding (dynamic): autocast's casts ran outside any kernel's scope, where symbolic
    sizes had no python dispatcher, and ``to(bfloat16)`` failed inside torch."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = self.lin(x)
            return y.float() * 2, y

    seen = []

    def backend(gm, example_inputs):
        expected = {n: n.meta["example_value"] for n in gm.graph.nodes
                    if isinstance(n.meta.get("example_value"), torch.Tensor)}
        fxprop.propagate(gm, *example_inputs)
        seen.append({n.name: (n.meta["val"].dtype, str(n.meta["val"].shape)) == (value.dtype, str(value.shape))
                     for n, value in expected.items()})
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(M(), backend=backend, fullgraph=True, dynamic=dynamic)(torch.randn(2, 8))
    assert out[1].dtype == torch.bfloat16
    assert seen and all(seen[0].values()) and len(seen[0]) >= 4
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_python_operators_on_tensors_are_autocast_in_a_dynamo_graph(dynamic):
    """Adversary finding: ``x @ y`` (``operator.matmul``) was never asked of autocast, so it kept
    float32 (and ``lin(x) @ x.t()`` refused bfloat16 against float32)."""
    lin = torch.nn.Linear(8, 8)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return x @ x.t(), lin(x) @ x.t()

    out, disagreements = _compiled_with_fxprop(f, torch.randn(6, 8), dynamic=dynamic)
    assert [value.dtype for value in out] == [value.dtype for value in f(torch.randn(6, 8))] == [torch.bfloat16] * 2
    assert disagreements == [[]]


def test_an_exported_autocast_block_with_symbolic_sizes_casts_as_torch_does():
    """Adversary finding: a symbolic propagation turned torch's python dispatcher off in the body
    of ``wrap_with_autocast``, where its casts need it."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.matmul(self.lin(x), x.t())

    program = torch.export.export(M(), (torch.randn(6, 8),), dynamic_shapes={"x": {0: torch.export.Dim("B")}})
    out = fxprop.propagate(program, fxprop.TensorSpec(("B", 8)))
    real = M()(torch.randn(6, 8))
    assert out.dtype == real.dtype == torch.bfloat16
    assert isinstance(out.shape[0], torch.SymInt) and str(out.shape[0]) == str(out.shape[1])


def test_a_checkpoint_inside_an_autocast_block_of_a_dynamic_dynamo_graph():
    """Adversary finding: the checkpointed body's casts failed with symbolic sizes."""
    from torch.utils.checkpoint import checkpoint
    lin = torch.nn.Linear(8, 8)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return checkpoint(lin, x, use_reentrant=False)

    out, disagreements = _compiled_with_fxprop(f, torch.randn(6, 8), dynamic=True)
    assert out.dtype == torch.bfloat16 and disagreements == [[]]


def _compiled_with_fxprop(f, *inputs, dynamic: bool) -> tuple:
    """``f(*inputs)`` compiled by a backend that propagates each of dynamo's graphs, and for each
    graph the nodes where fxprop disagrees with dynamo (`_agreement_with_dynamo`)."""
    disagreements = []

    def backend(gm, example_inputs):
        fxprop.propagate(gm, *example_inputs)
        disagreements.append(_agreement_with_dynamo(gm))
        return gm.forward

    torch._dynamo.reset()
    try:
        return torch.compile(f, backend=backend, dynamic=dynamic)(*inputs), disagreements
    finally:
        torch._dynamo.reset()


def _agreement_with_dynamo(gm: torch.fx.GraphModule) -> list:
    """Nodes whose value's dtype or sizes differ from dynamo's own example_value."""
    return [node.name for node in gm.graph.nodes if isinstance(node.meta.get("example_value"), torch.Tensor)
            and (node.meta["val"].dtype, str(node.meta["val"].shape))
            != (node.meta["example_value"].dtype, str(node.meta["example_value"].shape))]


def test_autocast_state_is_left_as_it_was_when_a_region_is_never_closed():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(torch.amp.autocast_mode._enter_autocast, ("cpu", torch.bfloat16, True, None))
    graph.output(graph.call_function(torch.matmul, (x, x)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert fxprop.propagate(gm, torch.randn(2, 2)).dtype == torch.bfloat16
    plain = torch.fx.symbolic_trace(lambda x: x @ x)
    assert fxprop.propagate(plain, torch.randn(2, 2)).dtype == torch.float32


def test_a_higher_order_op_without_a_rule_is_unsupported_and_named():
    gm = _graph_calling(hop.strict_mode, {"body": _traced(lambda x: (x + 1,))}, 1,
                        lambda xs, g: (g["body"], (xs[0],)))
    with pytest.raises(fxprop.UnsupportedError, match="strict_mode"):
        fxprop.propagate(gm, torch.randn(3))
    assert fxprop.lookup(hop.strict_mode).kind == "unsupported"
    assert fxprop.lookup(hop.cond).kind == "python"


def test_an_error_inside_a_subgraph_names_the_subgraphs_node():
    gm = _graph_calling(hop.wrap_with_set_grad_enabled, {"body": _traced(lambda x, y: (x @ y,))}, 2,
                        lambda xs, g: (False, g["body"], xs[0], xs[1]))
    with pytest.raises(fxprop.PropagationError, match="matmul") as caught:
        fxprop.propagate(gm, torch.randn(2, 3), torch.randn(4, 5))
    assert caught.value.node_name == "matmul"
    assert all("val" not in n.meta for n in gm.body.graph.nodes)  # nothing annotated on failure


# --- flex attention -----------------------------------------------------------------------------

def test_flex_attention_with_score_and_mask_functions():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(8))
            self.mask = create_block_mask(lambda b, h, m, n: m >= n, 1, 1, 8, 8, device="cpu")

        def forward(self, q, k, v):
            return flex_attention(q, k, v, score_mod=lambda score, b, h, m, n: score + self.bias[n],
                                  block_mask=self.mask, return_lse=True, enable_gqa=True)
    q = torch.randn(1, 8, 4, 16).transpose(1, 2)  # laid out (batch, length, heads, dim)
    k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 8)
    gm = exported(M(), q, k, v)
    out, lse = check_against_real(gm, q, k, v)
    assert out.shape == (1, 4, 8, 8) and out.stride() == (256, 8, 32, 1)  # the query's stride order
    assert lse.dtype == torch.float32 and lse.requires_grad
    assert val(gm, "sdpa_score0", "add").dtype == torch.float32
    assert val(gm, "sdpa_mask0", "ge").dtype == torch.bool


def test_associative_scan():
    combine = _traced(lambda a, s, b, t: (a * b + a, s + t))
    gm = _graph_calling(hop.associative_scan, {"combine": combine}, 2, lambda xs, g: (g["combine"], [xs[0], xs[1]], []))
    x = torch.randn(3, 5).t()
    out = check_against_real(gm, x, torch.randn(5))
    assert [o.shape for o in out] == [(5, 3), (5,)]


def test_while_loop_stack_output():
    gm = _graph_calling(hop.while_loop_stack_output, {"c": _traced(lambda i, x: i < 3),
                                                      "b": _traced(lambda i, x: (i + 1, x * 2))},
                        2, lambda xs, g: (g["c"], g["b"], (xs[0], xs[1]), ()))
    steps, stacked = fxprop.propagate(gm, torch.tensor(0), torch.randn(4))
    assert stacked.shape[1:] == (4,) and not isinstance(stacked.shape[0], int) and steps.shape[1:] == ()
    real = gm(torch.tensor(0), torch.randn(4))
    assert real[1].shape == (3, 4) and real[1].stride() == (4, 1) and stacked.stride()[1] == 1


def test_the_subgraph_decides_where_results_live():
    body = _traced(lambda x, y: (x.to("cuda:0") + y, x))
    gm = _graph_calling(hop.wrap_with_set_grad_enabled, {"body": body}, 2,
                        lambda xs, g: (False, g["body"], xs[0], xs[1]))
    moved, kept = fxprop.propagate(gm, fxprop.TensorSpec((3,)), fxprop.TensorSpec((3,), device="cuda:0"))
    assert moved.device == torch.device("cuda:0") and kept.device == torch.device("cpu")
    assert provenance(gm, "", "wrap_with_set_grad_enabled").kind == "python"


class _ScaledTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        return x * torch.tanh(x) * k, x > 0

    @staticmethod
    def backward(ctx, grad, _):
        (x,) = ctx.saved_tensors
        return grad * x, None


class _CallsAFunction(torch.nn.Module):
    def forward(self, x):
        y, positive = _ScaledTanh.apply(x, 2.0)
        return y + 1, positive


@pytest.mark.parametrize("requires_grad", [True, False])
def test_a_users_autograd_function_in_a_dynamo_graph(requires_grad):
    """With an input that requires grad, dynamo keeps the Function as autograd_function_apply."""
    x = torch.randn(2, 3, requires_grad=requires_grad)
    gm, _ = torch._dynamo.export(_CallsAFunction())(x)
    assert any(n.target is hop.autograd_function_apply for n in gm.graph.nodes) == requires_grad
    fxprop.testing.assert_matches_real(gm, x)  # torch runs the forward body through an Interpreter: root nodes only
    y, positive = gm.graph.output_node().meta["val"]
    assert y.requires_grad == requires_grad and not positive.requires_grad
    for name, sub in gm.named_modules():
        if name.startswith("fwd_body"):
            assert all("val" in n.meta for n in sub.graph.nodes if n.op != "output")


class _HoldsAParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor(1.5))


@pytest.mark.parametrize("case", ["parameter", "meta input", "cpu input"])
def test_print_formats_a_number_only_of_what_the_real_print_formats_as_one(case):
    """Adversary finding: a 0-dim Parameter or meta tensor takes object.__format__, which refuses a
    format spec; the stand-in was a plain CPU tensor, which formats as a number."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    value = graph.get_attr("p") if case == "parameter" else x
    graph.call_function(hop.print, ("{v:.2f}",), {"v": value})
    graph.output(None)
    gm = torch.fx.GraphModule(_HoldsAParameter(), graph)
    x = torch.empty((), device="meta") if case == "meta input" else torch.zeros(())
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            gm(x)
    except Exception as real:
        with pytest.raises(fxprop.PropagationError) as caught:
            fxprop.propagate(gm, x)
        assert caught.value.error_type is type(real)
    else:
        fxprop.propagate(gm, x)
