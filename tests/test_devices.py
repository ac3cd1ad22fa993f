"""Devices on a host without the target device: every expectation below is what torch gives on
a GPU, written from torch's documented semantics (and the source rules cited per case), never
read back from fxprop."""
from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import fxprop
from fxprop.devices import TRANSFERS, factories, indexing
from fxprop.devices.transfers import BACKEND_MOVES

aten = torch.ops.aten
CPU, CUDA0, CUDA1, META = (torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1),
                           torch.device("meta"))


def spec(*shape, dtype=torch.float32, device="cuda:0"):
    return fxprop.TensorSpec(shape, dtype=dtype, device=device)


def fake(*shape, dtype=torch.float32, device="cuda:0"):
    """A FakeTensor on a device this torch build lacks, made the way FakeTensorMode makes its own."""
    return FakeTensor(FakeTensorMode(), torch.empty(shape, dtype=dtype, device="meta"), torch.device(device))


class In:
    """A placeholder of a one-node graph, with the value `propagate` gets for it."""
    def __init__(self, name: str, value):
        self.name, self.value = name, value


def one_node(target, *args, op="call_function", **kwargs):
    """A graph holding one call (what symbolic_trace would constant-fold is kept as a node)."""
    graph, placeholders, values = torch.fx.Graph(), {}, []

    def convert(a):
        if isinstance(a, In):
            if a.name not in placeholders:
                placeholders[a.name] = graph.placeholder(a.name)
                values.append(a.value)
            return placeholders[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(convert(item) for item in a)
        return a

    node_args = convert(args)
    node_kwargs = {key: convert(value) for key, value in kwargs.items()}
    node = graph.create_node(op, target, node_args, node_kwargs, name="call")
    graph.output(node)
    return torch.fx.GraphModule(torch.nn.Module(), graph), values


def device_of_call(target, *args, op="call_function", **kwargs):
    gm, values = one_node(target, *args, op=op, **kwargs)
    fxprop.propagate(gm, *values)
    return next(n for n in gm.graph.nodes if n.name == "call").meta["val"]


def value_of(result):
    return result.device if isinstance(result, torch.Tensor) else result


x_cuda = In("x", spec(2, 3))
x_cpu = In("x", spec(2, 3, device="cpu"))
idx_cpu = In("i", spec(2, dtype=torch.int64, device="cpu"))
idx_cpu_2d = In("i", spec(2, 3, dtype=torch.int64, device="cpu"))
idx_cpu_scalar = In("i", spec(dtype=torch.int64, device="cpu"))
src_cuda = In("src", spec(2, 3))
src_cpu = In("src", spec(2, 3, device="cpu"))
scalar_cpu = In("s", spec(device="cpu"))


# --- 1. the default rule ---------------------------------------------------------------

def test_results_live_on_the_common_device_and_cpu_scalars_defer():
    def f(x, y, s):
        a = x + y          # cuda:0 + cuda:0 -> cuda:0
        b = a * s          # a 0-dim CPU tensor joins a cuda op: the result stays on cuda:0
        c = s * 2          # only the CPU scalar: cpu
        d = torch.where(a > 0, a, s)  # TensorIterator op with a CPU scalar operand: cuda:0
        return b, c, d

    gm = torch.fx.symbolic_trace(f)
    fxprop.propagate(gm, spec(2, 3), fake(2, 3), spec(device="cpu"))
    want = {"x": CUDA0, "y": CUDA0, "s": CPU, "add": CUDA0, "mul": CUDA0, "mul_1": CPU, "gt": CUDA0, "where": CUDA0}
    assert {n.name: n.meta["val"].device for n in gm.graph.nodes if n.name in want} == want


def test_device_strings_are_normalized_as_torch_stores_them():
    assert fxprop.TensorSpec((2,), device="cuda").device == CUDA0
    assert device_of_call("to", x_cpu, "cuda", op="call_method").device == CUDA0
    assert device_of_call("cuda", x_cpu, op="call_method").device == CUDA0
    assert device_of_call(torch.zeros, In("n", 3), device="cuda").device == CUDA0
    assert device_of_call("to", x_cpu, 1, op="call_method").device == CUDA1  # an int is a cuda index


def test_two_non_scalar_tensors_on_different_devices_name_the_node_and_both_devices():
    gm = torch.fx.symbolic_trace(lambda x, y: torch.relu(x) + y)
    with pytest.raises(fxprop.DeviceMismatchError) as raised:
        fxprop.propagate(gm, spec(2, 3), spec(2, 3, device="cpu"))
    assert isinstance(raised.value, fxprop.PropagationError)
    assert raised.value.node_name == "add"
    assert "cuda:0" in str(raised.value) and "cpu" in str(raised.value)


def test_a_cuda_scalar_does_not_defer_to_a_cpu_tensor():
    # Only CPU 0-dim tensors are exempt (TensorIterator); a 0-dim cuda tensor with a CPU tensor fails.
    gm = torch.fx.symbolic_trace(lambda x, s: x * s)
    with pytest.raises(fxprop.DeviceMismatchError, match="cpu and cuda:0|cuda:0 and cpu"):
        fxprop.propagate(gm, spec(2, 3, device="cpu"), spec())


def test_tensors_on_two_cuda_devices_are_refused():
    gm = torch.fx.symbolic_trace(lambda x, y: x @ y)
    with pytest.raises(fxprop.DeviceMismatchError, match="cuda:0 and cuda:1") as raised:
        fxprop.propagate(gm, spec(2, 3), spec(3, 2, device="cuda:1"))
    assert raised.value.node_name == "matmul"



class _CountedLoop(torch.nn.Module):
    def forward(self, x):
        return torch._higher_order_ops.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2),
                                                  (torch.tensor(0), x))


@pytest.mark.parametrize("device", ["meta", "cuda:0"])
def test_an_item_of_several_outputs_keeps_its_own_device(device):
    """Adversary finding: ``getitem`` of a while_loop's carried (CPU counter, x) placed the counter on
    x's device, as the inputs' common device; a warm cache kept its own. An item is what it was."""
    real = _CountedLoop()(torch.randn(3, 4, device="meta"))
    assert [t.device.type for t in real] == ["cpu", "meta"]
    ep = torch.export.export(_CountedLoop(), (torch.randn(3, 4),))
    memo = fxprop.RuleCache()
    for cache in (False, memo, memo):
        out = fxprop.propagate(ep, spec(3, 4, device=device), cache=cache)
        assert [t.device for t in out] == [torch.device("cpu"), torch.device(device)]


# --- 2. the table: moves -----------------------------------------------------------------

x_other = In("other", spec(1, dtype=torch.int64, device="cpu"))

MOVES = [
    # (case, target, args, kwargs, expected device, expected dtype) — Tensor.to's documented overloads
    ("to(device)", "to", (x_cuda, "cpu"), {}, CPU, torch.float32),
    ("to(torch.device)", "to", (x_cpu, torch.device("cuda", 1)), {}, CUDA1, torch.float32),
    ("to(dtype) keeps the device", "to", (x_cuda, torch.float16), {}, CUDA0, torch.float16),
    ("to(other) takes other's device and dtype", "to", (x_cuda, x_other), {}, CPU, torch.int64),
    ("to(device, dtype, non_blocking, copy)", "to", (x_cuda, "cpu", torch.int32, True, True), {}, CPU, torch.int32),
    ("to(device=, dtype=)", "to", (x_cuda,), {"device": "cuda:1", "dtype": torch.half}, CUDA1, torch.float16),
    ("to(memory_format=) keeps the device", "to", (In("x", spec(1, 2, 3, 4)),),
     {"memory_format": torch.channels_last}, CUDA0, torch.float32),
    ("to(non_blocking=True)", "to", (x_cpu, "cuda"), {"non_blocking": True}, CUDA0, torch.float32),
    ("Tensor.to as a function", torch.Tensor.to, (x_cuda, "cpu"), {}, CPU, torch.float32),
    ("aten.to.device", aten.to.device, (x_cpu, CUDA1, torch.float16), {}, CUDA1, torch.float16),
    ("aten.to.dtype", aten.to.dtype, (x_cuda, torch.float64), {}, CUDA0, torch.float64),
    ("aten.to.other", aten.to.other, (x_cuda, x_other), {}, CPU, torch.int64),
    ("aten.to.dtype_layout", aten.to.dtype_layout, (x_cpu,),
     {"dtype": torch.float16, "layout": torch.strided, "device": CUDA0, "pin_memory": False}, CUDA0, torch.float16),
    ("aten.to.prim_Device", aten.to.prim_Device, (x_cuda, CPU), {}, CPU, torch.float32),
    ("aten.to.prim_dtype: an int dtype is no device", aten.to.prim_dtype, (x_cuda, 5), {}, CUDA0, torch.float16),
    ("x.cuda()", "cuda", (x_cpu,), {}, CUDA0, torch.float32),
    ("x.cuda(1)", "cuda", (x_cpu, 1), {}, CUDA1, torch.float32),
    ("x.cuda(device='cuda:1', non_blocking=True)", "cuda", (x_cpu,), {"device": "cuda:1", "non_blocking": True},
     CUDA1, torch.float32),
    ("Tensor.cuda as a function", torch.Tensor.cuda, (x_cpu,), {}, CUDA0, torch.float32),
    ("x.cpu()", "cpu", (x_cuda,), {}, CPU, torch.float32),
    ("Tensor.cpu as a function", torch.Tensor.cpu, (x_cuda,), {}, CPU, torch.float32),
    ("x.xpu()", "xpu", (x_cpu,), {}, torch.device("xpu", 0), torch.float32),
    ("x.mtia()", "mtia", (x_cpu,), {}, torch.device("mtia", 0), torch.float32),
    ("x.type(dtype) keeps the device", "type", (x_cuda, torch.float16), {}, CUDA0, torch.float16),
    ("x.type('torch.cuda.HalfTensor') moves to cuda", "type", (x_cpu, "torch.cuda.HalfTensor"), {}, CUDA0,
     torch.float16),
    ("x.type('torch.DoubleTensor') moves to the CPU", "type", (x_cuda, "torch.DoubleTensor"), {}, CPU,
     torch.float64),
    ("aten._to_copy(device=)", aten._to_copy.default, (x_cuda,), {"device": CPU, "dtype": torch.float16}, CPU,
     torch.float16),
    ("aten._to_copy keeps self's device", aten._to_copy.default, (x_cuda,), {"dtype": torch.float16}, CUDA0,
     torch.float16),
    ("copy_ from the CPU into cuda", "copy_", (x_cuda, src_cpu), {}, CUDA0, torch.float32),
    ("aten.copy_ from cuda into the CPU", aten.copy_.default, (x_cpu, src_cuda), {}, CPU, torch.float32),
    ("aten.copy (functional) from the CPU", aten.copy.default, (x_cuda, src_cpu), {}, CUDA0, torch.float32),
]


@pytest.mark.parametrize("case,target,args,kwargs,device,dtype", MOVES, ids=[m[0] for m in MOVES])
def test_moves(case, target, args, kwargs, device, dtype):
    op = "call_method" if isinstance(target, str) else "call_function"
    result = device_of_call(target, *args, op=op, **kwargs)
    assert (result.device, result.dtype) == (device, dtype)


def test_to_with_memory_format_and_a_move_keeps_the_requested_layout():
    result = device_of_call("to", In("x", spec(1, 2, 3, 4, device="cpu")), "cuda",
                            memory_format=torch.channels_last, op="call_method")
    assert result.device == CUDA0 and result.is_contiguous(memory_format=torch.channels_last)


def test_a_move_to_the_same_device_is_the_same_tensor_and_a_real_move_a_new_one():
    def f(x):
        return x.to("cuda:0"), x.to("cpu")
    gm = torch.fx.symbolic_trace(f)
    same, moved = fxprop.propagate(gm, spec(2, 3))
    assert same.device == CUDA0 and moved.device == CPU and moved.stride() == (3, 1)


def test_type_without_arguments_is_the_host_type_name():
    assert device_of_call("type", x_cuda, op="call_method") == "torch.cuda.FloatTensor"
    assert device_of_call("type", x_cpu, op="call_method") == "torch.FloatTensor"


def test_cuda_with_a_device_of_another_kind_is_refused():
    with pytest.raises(fxprop.PropagationError, match="Tensor.cuda: invalid device"):
        device_of_call("cuda", x_cpu, device="cpu", op="call_method")


# --- 2. the table: factories -------------------------------------------------------------

n = In("n", 3)
CONSTRUCTOR_SAMPLES = {
    "arange": ((n,), {}), "as_tensor": (([1.0, 2.0],), {}), "asarray": (([1.0, 2.0],), {}),
    "bartlett_window": ((n,), {}), "blackman_window": ((n,), {}), "empty": ((n, 2), {}),
    "empty_permuted": (((n, 2), (1, 0)), {}), "empty_strided": (((n, 2), (1, 3)), {}), "eye": ((n,), {}),
    "full": (((n,), 1.0), {}), "hamming_window": ((n,), {}), "hann_window": ((n,), {}),
    "kaiser_window": ((n,), {}), "linspace": ((0, 1, n), {}), "logspace": ((0, 1, n), {}), "ones": ((n,), {}),
    "rand": ((n,), {}), "randint": ((0, 5, (n,)), {}), "randn": ((n,), {}), "randperm": ((n,), {}),
    "scalar_tensor": ((1.0,), {}), "tensor": (([1, 2],), {}), "tril_indices": ((n, n), {}),
    "triu_indices": ((n, n), {}), "zeros": ((n,), {}), "fftfreq": ((n,), {}), "rfftfreq": ((n,), {}),
}


def _constructor(name):
    return getattr(torch.fft, name) if name in factories.FFT_CONSTRUCTORS else getattr(torch, name)


def test_the_constructor_list_is_torchs_own():
    """The functions torch's default-device mode intercepts, less sparse/nested/quantized ones
    (not propagated) and the deprecated torch.range."""
    from torch.utils._device import _device_constructors
    names = {f.__name__.removeprefix("fft_") for f in _device_constructors()}
    names -= {"range", "nested_tensor", "empty_quantized"} | {n for n in names if n.startswith("sparse_")}
    assert names == set(factories.CONSTRUCTORS) | set(factories.FFT_CONSTRUCTORS)


@pytest.mark.parametrize("name", [*factories.CONSTRUCTORS, *factories.FFT_CONSTRUCTORS])
def test_constructors_take_the_device_argument_else_the_default_device(name):
    args, kwargs = CONSTRUCTOR_SAMPLES[name]
    target = _constructor(name)
    assert device_of_call(target, *args, device="cuda", **kwargs).device == CUDA0
    assert device_of_call(target, *args, device=CUDA1, **kwargs).device == CUDA1
    assert device_of_call(target, *args, **kwargs).device == CPU  # no default device set: the CPU
    # The default device when propagate is called: `with torch.device(...)`. On this CPU-only
    # build torch cannot allocate on cuda:1, but it can hold it as the default; fxprop only reads it.
    with torch.device("cuda:1"):
        assert device_of_call(target, *args, **kwargs).device == CUDA1
    with torch.device("meta"):
        assert device_of_call(target, *args, **kwargs).device == META
        assert device_of_call(target, *args, device="cuda:0", **kwargs).device == CUDA0


def test_set_default_device_is_read_when_propagate_is_called():
    torch.set_default_device("cuda")  # "cuda" normalizes to cuda:0, as torch.get_default_device() would on a GPU
    try:
        assert device_of_call(torch.zeros, n).device == CUDA0
        assert device_of_call(torch.arange, n, dtype=torch.int64).device == CUDA0
    finally:
        torch.set_default_device(None)
    assert device_of_call(torch.zeros, n).device == CPU


def test_tensor_of_tensor_data_keeps_the_datas_device_unless_a_default_is_set():
    data = In("data", spec(3))
    assert device_of_call(torch.tensor, data).device == CUDA0
    assert device_of_call(torch.as_tensor, data).device == CUDA0
    with torch.device("cpu"):
        assert device_of_call(torch.as_tensor, data).device == CPU


def test_a_factory_with_the_device_of_an_input():
    gm = torch.fx.symbolic_trace(lambda x: torch.arange(x.size(0), device=x.device) + x[:, 0])
    fxprop.propagate(gm, spec(4, 2))
    want = {"getattr_1": CUDA0, "arange": CUDA0, "add": CUDA0}
    got = {n.name: value_of(n.meta["val"]) for n in gm.graph.nodes if n.name in want}
    assert got == want


ATEN_FACTORY_SAMPLES = {
    "arange": (aten.arange.default, (3,)), "bartlett_window": (aten.bartlett_window.default, (3,)),
    "blackman_window": (aten.blackman_window.default, (3,)), "empty": (aten.empty.memory_format, ([3, 2],)),
    "empty_permuted": (aten.empty_permuted.default, ([3, 2], [1, 0])),
    "empty_strided": (aten.empty_strided.default, ([3, 2], [1, 3])), "eye": (aten.eye.default, (3,)),
    "full": (aten.full.default, ([3], 1.0)), "hamming_window": (aten.hamming_window.default, (3,)),
    "hann_window": (aten.hann_window.default, (3,)), "kaiser_window": (aten.kaiser_window.default, (3,)),
    "linspace": (aten.linspace.default, (0, 1, 3)), "logspace": (aten.logspace.default, (0, 1, 3)),
    "ones": (aten.ones.default, ([3],)), "rand": (aten.rand.default, ([3],)),
    "randint": (aten.randint.low, (0, 5, [3])), "randn": (aten.randn.default, ([3],)),
    "randperm": (aten.randperm.default, (3,)), "scalar_tensor": (aten.scalar_tensor.default, (1.0,)),
    "tril_indices": (aten.tril_indices.default, (3, 3)), "triu_indices": (aten.triu_indices.default, (3, 3)),
    "zeros": (aten.zeros.default, ([3],)), "fft_fftfreq": (aten.fft_fftfreq.default, (3,)),
    "fft_rfftfreq": (aten.fft_rfftfreq.default, (3,)), "normal": (aten.normal.float_float, (0.0, 1.0, [3])),
}
ATEN_FACTORIES = [name for name in (*factories.CONSTRUCTORS, *factories.FFT_CONSTRUCTORS.values(), "normal")
                  if hasattr(aten, name) and name not in factories.TAKES_DATA]


@pytest.mark.parametrize("name", ATEN_FACTORIES)
def test_aten_factories_take_the_device_argument_else_the_cpu(name):
    op, args = ATEN_FACTORY_SAMPLES[name]
    assert device_of_call(op, *args, device=CUDA0).device == CUDA0
    # An aten call with device=None is placed by c10's TensorOptions, the CPU: torch's default
    # device applies to python-level constructors only (torch.utils._device).
    with torch.device("cuda:1"):
        assert device_of_call(op, *args).device == CPU


def test_aten_factory_out_variant_lives_with_out():
    assert device_of_call(aten.zeros.out, [3], out=In("out", spec(3))).device == CUDA0


LIKE_SAMPLES = {"empty_like": (), "zeros_like": (), "ones_like": (), "full_like": (1.0,), "rand_like": (),
                "randn_like": (), "randint_like": (5,)}
NEW_SAMPLES = {"new_empty": ((2,),), "new_empty_strided": ((2,), (1,)), "new_zeros": ((2,),), "new_ones": ((2,),),
               "new_full": ((2,), 1.0), "new_tensor": ([1.0, 2.0],)}


@pytest.mark.parametrize("name", factories.LIKE)
def test_like_factories_take_the_device_argument_else_the_inputs(name):
    extra = LIKE_SAMPLES[name]
    assert device_of_call(getattr(torch, name), x_cuda, *extra).device == CUDA0
    assert device_of_call(getattr(torch, name), x_cuda, *extra, device="cpu").device == CPU
    assert device_of_call(getattr(aten, name).default, x_cuda, *extra).device == CUDA0
    with torch.device("cpu"):  # the default device does not apply to *_like
        assert device_of_call(getattr(torch, name), x_cuda, *extra).device == CUDA0


@pytest.mark.parametrize("name", factories.NEW)
def test_new_factories_take_the_device_argument_else_selfs(name):
    extra = NEW_SAMPLES[name]
    assert device_of_call(name, x_cuda, *extra, op="call_method").device == CUDA0
    assert device_of_call(name, x_cuda, *extra, device="cpu", op="call_method").device == CPU
    assert device_of_call(getattr(torch.Tensor, name), x_cpu, *extra, device="cuda:1").device == CUDA1


def test_new_tensor_of_cpu_data_lives_with_self():
    assert device_of_call("new_tensor", x_cuda, In("data", spec(2, device="cpu")), op="call_method").device == CUDA0


def test_pin_memory():
    transposed_cpu = In("x", fxprop.TensorSpec((3, 2), device="cpu", stride=(1, 3)))
    pinned = device_of_call("pin_memory", transposed_cpu, op="call_method")
    assert pinned.device == CPU and pinned.stride() == (1, 3)  # a pinned copy keeps sizes and strides
    assert device_of_call(aten._pin_memory.default, x_cpu).device == CPU
    with pytest.raises(fxprop.DeviceMismatchError, match="only dense CPU tensors can be pinned"):
        device_of_call("pin_memory", x_cuda, op="call_method")
    # pin_memory=True allocates page-locked host memory: the tensor lives on the CPU.
    assert device_of_call(torch.empty, n, pin_memory=True).device == CPU
    assert device_of_call(torch.zeros_like, x_cpu, pin_memory=True).device == CPU


# --- 2. the table: host values ---------------------------------------------------------

def test_device_attributes_are_host_values():
    def f(x):
        return x.device, x.is_cuda, x.is_cpu, x.get_device()
    gm = torch.fx.symbolic_trace(f)
    assert fxprop.propagate(gm, spec(2, device="cuda:1")) == (CUDA1, True, False, 1)
    assert fxprop.propagate(gm, spec(2, device="cpu")) == (CPU, False, True, -1)


def test_item_and_tolist_are_read_on_the_host():
    def f(x, counts):
        return x.sum().item(), counts.tolist(), x.tolist()
    gm = torch.fx.symbolic_trace(f)
    total, counts, values = fxprop.propagate(gm, fake(2, 2), torch.tensor([3, 1, 4]))
    assert counts == [3, 1, 4]  # a small integer input passed for real keeps its values
    assert len(values) == 2 and len(values[0]) == 2  # placeholders of the right nesting
    nodes = {node.name: node for node in gm.graph.nodes}
    assert nodes["item"].meta["fxprop"].kind in ("fallback", "python")
    assert not isinstance(nodes["tolist"].meta["val"], torch.Tensor)


def test_nonzero_lives_with_its_input_and_its_count_is_read_on_the_host():
    gm = torch.fx.symbolic_trace(lambda x, y: (torch.nonzero(x), torch.argwhere(x), y.nonzero()))
    a, b, c = fxprop.propagate(gm, fake(2, 3, dtype=torch.int64), torch.tensor([0, 2, 0, 5]))
    assert a.device == b.device == CUDA0 and a.dim() == b.dim() == 2 and a.shape[1] == 2
    assert c.device == CPU and c.dim() == 2 and c.shape[1] == 1


# --- 2. the table: indexing --------------------------------------------------------------

values_cuda = In("v", spec(2, 3))
values_cpu = In("v", spec(2, 3, device="cpu"))
value_cpu_scalar = In("v", spec(device="cpu"))

INDEXING = [
    # advanced indexing moves index tensors to self's device (device_check: NoCheck)
    ("x[cpu_idx]", operator.getitem, (x_cuda, idx_cpu), CUDA0),
    ("x[cpu_idx, :]", operator.getitem, (x_cuda, (idx_cpu, slice(None))), CUDA0),
    ("aten.index", aten.index.Tensor, (x_cuda, [idx_cpu]), CUDA0),
    ("aten._unsafe_index", aten._unsafe_index.Tensor, (x_cuda, [idx_cpu]), CUDA0),
    ("torch.index_put", torch.index_put, (x_cuda, (idx_cpu,), values_cuda), CUDA0),
    ("index_put_ with a CPU 0-dim value", torch.Tensor.index_put_, (x_cuda, (idx_cpu,), value_cpu_scalar), CUDA0),
    ("aten._unsafe_index_put", aten._unsafe_index_put.default, (x_cuda, [idx_cpu], values_cuda), CUDA0),
    ("aten._index_put_impl_", aten._index_put_impl_.default, (x_cuda, [idx_cpu], values_cuda), CUDA0),
    # scatters implemented by copy_ take their source from any device
    ("slice_scatter", torch.slice_scatter, (x_cuda, In("src", spec(1, 3, device="cpu")), 0, 0, 1), CUDA0),
    ("select_scatter", torch.select_scatter, (x_cuda, In("src", spec(3, device="cpu")), 0, 0), CUDA0),
    ("diagonal_scatter", torch.diagonal_scatter, (x_cuda, In("src", spec(2, device="cpu"))), CUDA0),
    ("as_strided_scatter", torch.as_strided_scatter, (x_cuda, In("src", spec(2, device="cpu")), (2,), (1,)), CUDA0),
]


@pytest.mark.parametrize("case,target,args,device", INDEXING, ids=[c[0] for c in INDEXING])
def test_indexing_with_indices_from_the_cpu(case, target, args, device):
    assert device_of_call(target, *args).device == device


def test_setitem_with_cpu_indices_and_with_slices():
    graph = torch.fx.Graph()
    x, i, v, w = (graph.placeholder(name) for name in "xivw")
    graph.call_function(operator.setitem, (x, i, v))                  # index_put_: values on self's device
    graph.call_function(operator.setitem, (x, slice(0, 1), w))        # copy_: a source from any device
    graph.output(graph.call_function(torch.relu, (x,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    out = fxprop.propagate(gm, spec(2, 3), spec(2, dtype=torch.int64, device="cpu"), spec(2, 3),
                           spec(1, 3, device="cpu"))
    assert out.device == CUDA0


def test_index_put_refuses_values_from_another_device():
    with pytest.raises(fxprop.DeviceMismatchError, match="values must be on the device of self"):
        device_of_call(torch.index_put, x_cuda, (idx_cpu,), values_cpu)
    gm, _ = one_node(operator.setitem, x_cuda, idx_cpu, values_cpu)
    with pytest.raises(fxprop.DeviceMismatchError, match="values must be on the device of self") as raised:
        fxprop.propagate(gm, spec(2, 3), spec(2, dtype=torch.int64, device="cpu"), spec(2, 3, device="cpu"))
    assert raised.value.node_name == "call"


STRICT = {
    # each op's generated CUDA wrapper checks every tensor's device, with no CPU-scalar exception
    "index_select": lambda: (torch.index_select, (x_cuda, 0, idx_cpu_scalar)),
    "gather": lambda: (torch.gather, (x_cuda, 1, idx_cpu_2d)),
    "take": lambda: (torch.take, (x_cuda, idx_cpu)),
    "take_along_dim": lambda: (torch.take_along_dim, (x_cuda, idx_cpu_2d, 1)),
    "put": lambda: (torch.Tensor.put, (x_cuda, idx_cpu, In("src", spec(2)))),
    "put_": lambda: ("put_", (x_cuda, idx_cpu, In("src", spec(2)))),
    "scatter": lambda: (torch.scatter, (x_cuda, 1, idx_cpu_2d, src_cuda)),
    "scatter_": lambda: ("scatter_", (x_cuda, 1, idx_cpu_2d, src_cuda)),
    "scatter_add": lambda: (torch.scatter_add, (x_cuda, 1, idx_cpu_2d, src_cuda)),
    "scatter_add_": lambda: ("scatter_add_", (x_cuda, 1, idx_cpu_2d, src_cuda)),
    "scatter_reduce": lambda: (torch.scatter_reduce, (x_cuda, 1, idx_cpu_2d, src_cuda, "sum")),
    "scatter_reduce_": lambda: ("scatter_reduce_", (x_cuda, 1, idx_cpu_2d, src_cuda, "sum")),
    "index_add": lambda: (torch.index_add, (x_cuda, 0, idx_cpu, src_cuda)),
    "index_add_": lambda: ("index_add_", (x_cuda, 0, idx_cpu, src_cuda)),
    "index_copy": lambda: (torch.index_copy, (x_cuda, 0, idx_cpu, src_cuda)),
    "index_copy_": lambda: ("index_copy_", (x_cuda, 0, idx_cpu, src_cuda)),
    "index_reduce": lambda: (torch.index_reduce, (x_cuda, 0, idx_cpu, src_cuda, "prod")),
    "index_reduce_": lambda: ("index_reduce_", (x_cuda, 0, idx_cpu, src_cuda, "prod")),
    "masked_scatter": lambda: (torch.masked_scatter, (x_cuda, In("m", spec(2, 3, dtype=torch.bool, device="cpu")),
                                                      src_cuda)),
    "masked_scatter_": lambda: ("masked_scatter_", (x_cuda, In("m", spec(2, 3, dtype=torch.bool, device="cpu")),
                                                    src_cuda)),
    "embedding": lambda: (F.embedding, (idx_cpu, In("w", spec(10, 4)))),
    "nextafter": lambda: (torch.nextafter, (x_cuda, scalar_cpu)),
}


def test_every_same_device_op_has_a_case():
    assert set(STRICT) == set(indexing.SAME_DEVICE_NO_CPU_SCALARS)


@pytest.mark.parametrize("name", indexing.SAME_DEVICE_NO_CPU_SCALARS)
def test_index_and_scatter_ops_refuse_a_cpu_index_into_a_cuda_tensor(name):
    target, args = STRICT[name]()
    op = "call_method" if isinstance(target, str) else "call_function"
    with pytest.raises(fxprop.DeviceMismatchError, match="cuda:0 and cpu|cpu and cuda:0"):
        device_of_call(target, *args, op=op)


def test_same_device_indices_are_fine():
    idx = In("i", spec(2, dtype=torch.int64))
    assert device_of_call(torch.index_select, x_cuda, 0, idx).device == CUDA0
    assert device_of_call(F.embedding, idx, In("w", spec(10, 4))).device == CUDA0


# --- every entry of the table is exercised above ---------------------------------------

def _targets_of_cases():
    yield from (m[1] for m in MOVES)
    yield from (c[1] for c in INDEXING)
    yield from (STRICT[name]()[0] for name in STRICT)
    yield from (_constructor(name) for name in CONSTRUCTOR_SAMPLES)
    yield from (op for op, _ in ATEN_FACTORY_SAMPLES.values())
    yield from (getattr(torch, name) for name in LIKE_SAMPLES)
    yield from NEW_SAMPLES
    yield from ("pin_memory", aten._pin_memory.default, getattr, "get_device", "item", "tolist", torch.nonzero,
                torch.argwhere, operator.setitem, "type", aten.zeros.out,
                torch.ops.higher_order.cond,  # placed by its subgraphs: tests/test_higher_order.py
                torch.tensor_split)  # indices read on the host: tests/test_edge_cases_values_and_meshes.py


def test_every_rule_of_the_table_has_a_case():
    covered = {TRANSFERS[target][1] for target in _targets_of_cases() if target in TRANSFERS}
    missing = sorted({name for name, fn in TRANSFERS.values() if fn not in covered})
    assert not missing, f"device rules without a test case: {missing}"
    assert set(BACKEND_MOVES) <= {m[1] for m in MOVES}


def test_lookup_reports_the_table():
    for target in (torch.zeros, aten._to_copy.default, aten.to, "cuda", operator.getitem, "item", torch.index_select):
        assert fxprop.lookup(target).device_rule is not None, target


# --- 5. the same one-op graphs for real on a GPU -------------------------------------------

def _needs(case_devices):
    if not torch.cuda.is_available():
        return "no CUDA device: the real-GPU comparison runs only where torch.cuda.is_available()"
    if any(d.type not in ("cpu", "cuda") for d in case_devices):
        return "needs a device of another kind"
    if any(d.type == "cuda" and d.index >= torch.cuda.device_count() for d in case_devices):
        return "needs more CUDA devices"
    return None


REAL_CASES = [(m[0], m[1], m[2], m[3], {m[4]}) for m in MOVES] + [(c[0], c[1], c[2], {}, {c[3]}) for c in INDEXING]


@pytest.mark.parametrize("case,target,args,kwargs,devices", REAL_CASES, ids=[c[0] for c in REAL_CASES])
def test_one_op_graphs_match_a_real_gpu_run(case, target, args, kwargs, devices):
    gm, values = one_node(target, *args, op="call_method" if isinstance(target, str) else "call_function", **kwargs)
    named = [*args, *kwargs.values(), *values]
    devices = devices | {torch.device(v) for v in named if isinstance(v, (torch.device, str)) and ":" in str(v)}
    devices |= {v.device for v in values if isinstance(v, fxprop.TensorSpec)}
    reason = _needs(devices)
    if reason:
        pytest.skip(reason)
    from fxprop.testing import assert_matches_real
    assert_matches_real(gm, *values, check_device=True)


def test_a_device_read_off_an_input_keeps_its_type():
    def f(x):
        return x + torch.ones(2, 2, device=x.device.type), x.device.index
    gm = torch.fx.symbolic_trace(f)
    fxprop.propagate(gm, fxprop.TensorSpec((2, 2), device="cuda:0"))
    out, index = gm.graph.output_node().meta["val"]
    assert out.device == torch.device("cuda:0") and index == 0


@pytest.mark.parametrize("overload, args", [
    (aten.normal.Tensor_float, (torch.randn(3),)), (aten.normal.float_Tensor, (0.0, torch.rand(3))),
    (aten.normal.Tensor_Tensor, (torch.randn(3), torch.rand(3))), (aten.normal, (torch.randn(3), torch.rand(3)))])
def test_an_op_that_is_a_factory_in_one_overload_only_is_placed_by_its_schema(overload, args):
    from fxprop.testing import check_rule
    check_rule(overload, *args)
