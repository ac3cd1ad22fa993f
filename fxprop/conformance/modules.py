"""ModuleInfo conformance: fxprop and FakeTensorProp on torch.nn modules, each compared with real execution.

For every ModuleInfo in torch's ``module_db``, on the CPU in float32 (the first dtype the
ModuleInfo lists when it lacks float32), in training and in eval mode, with inputs that
require grad and inputs that do not, every sample of ``module_inputs_func`` and every
forward error of ``module_error_inputs_func`` is checked:

    build     construct the module (``module_cls(*args, **kwargs)``, then ``.to(dtype)`` and
              ``.train(training)``, as torch's test_modules does) and a graph of one
              ``call_module`` node with one placeholder per forward argument, keyword ones
              included (`module_graph`)
    real      run a deep copy of the graph on the sample's own inputs; keep every node's metadata
    fxprop    propagate the graph on the inputs as a user passes them (`as_user_passes`):
              floating point tensors of one or more dims data-free (FakeTensors: metadata, no
              values), the rest -- integer and bool tensors (indices, lengths, masks), 0-dim
              tensors, python values -- real, since their values decide shapes and checks and
              fxprop reads the values of real small integer tensors and numbers
              (`fxprop.engine.inputs.values_worth_knowing`). The user's module must come out untouched:
              parameters and buffers bit for bit, BatchNorm's counters, lazy modules still lazy
              (`fxprop.testing.assert_no_side_effects`).
    fake      torch.fx's FakeTensorProp on a deep copy of the same graph, every tensor input
              data-free (the anchor)

Every node is compared as `fxprop.testing.compare_values` does: shape, dtype, significant
strides, device and requires_grad of tensors, python values by value. FakeTensorProp writes
``meta["val"]`` through ``snapshot_fake``, which detaches every value, so its ``requires_grad``
is always False; its score is reported as it is and with ``requires_grad`` not compared.

When real execution raises, fxprop must raise a `PropagationError` of the same exception type
(FakeTensorProp: an exception of that type) to count as a match. Error inputs that fail in the
constructor have no forward to propagate and are counted apart (`ModuleResult.construction_errors`).

>>> from fxprop.conformance import modules
>>> result = modules.run_moduleinfo(modules.moduleinfos()["nn.Linear"], max_samples=2)
>>> result.status, result.fxprop_matches == result.total
('verified', True)
"""
from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from ..engine.propagation import propagate
from ..engine.inputs import values_worth_knowing
from ..testing import Mismatch, _Recorder, assert_no_side_effects, compare_nodes
from .. import torch_compat
from ..torch_compat import FakeTensorMode, pytree
from . import MATCH, Tally, Verdict, _category, _first_line, _judge_error, _short, _spread, sweep_table

__all__ = ["MAX_SAMPLES", "MODULE_CI_SLICE", "ModuleResult", "ModuleSampleResult", "as_user_passes",
           "check_module_call", "check_module_sample", "module_dtype", "module_graph", "moduleinfos", "run_moduleinfo", "sweep"]

MAX_SAMPLES = 32  # per module, training mode and requires_grad, spread evenly over all of its samples

# The representative slice of the default test run: every module family, the lazy modules,
# the losses that take index or length inputs, and the modules that read buffers and masks.
MODULE_CI_SLICE = (
    "nn.Linear", "nn.Bilinear", "nn.Conv2d", "nn.ConvTranspose1d", "nn.LazyConv2d", "nn.LazyConvTranspose1d",
    "nn.BatchNorm1d", "nn.GroupNorm", "nn.LayerNorm", "nn.InstanceNorm2d", "nn.MaxPool2d", "nn.AvgPool1d",
    "nn.AdaptiveAvgPool2d", "nn.FractionalMaxPool2d", "nn.Embedding", "nn.CrossEntropyLoss", "nn.NLLLoss",
    "nn.CTCLoss", "nn.MultiMarginLoss", "nn.GaussianNLLLoss", "nn.TransformerEncoder", "nn.MultiheadAttention",
    "nn.LSTM", "nn.GRUCell", "nn.PReLU", "nn.GELU", "nn.Softmax", "nn.ReflectionPad2d", "nn.ZeroPad1d",
)


@dataclass(frozen=True)
class ModuleSampleResult:
    """One sample in one mode: ``label`` is ``train|eval``, ``grad|no_grad`` and the sample's index
    (``error`` for an error input) and description."""
    label: str
    real_error: str | None
    fxprop: Verdict
    fake: Verdict
    fake_ignoring_requires_grad: Verdict


@dataclass
class ModuleResult(Tally):
    """Every sample of one ModuleInfo. ``skipped`` says why no sample ran (the module is then unverified)."""
    key: str
    samples: list[ModuleSampleResult] = field(default_factory=list)
    construction_errors: int = 0
    skipped: str | None = None

    @property
    def fake_matches_ignoring_requires_grad(self) -> int:
        return sum(s.fake_ignoring_requires_grad.ok for s in self.samples)


    def describe_mismatches(self, limit: int = 5) -> str:
        lines = [f"{self.key}: fxprop matched {self.fxprop_matches}/{self.total} samples "
                 f"(FakeTensorProp {self.fake_matches}/{self.total}, "
                 f"{self.fake_matches_ignoring_requires_grad}/{self.total} with requires_grad not compared)"]
        for sample in self.fxprop_mismatches()[:limit]:
            lines.append(f"  {sample.label} [{sample.fxprop.category}]: {sample.fxprop.detail}")
        hidden = len(self.fxprop_mismatches()) - limit
        if hidden > 0:
            lines.append(f"  ... and {hidden} more")
        return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def moduleinfos() -> dict[str, Any]:
    """Every ModuleInfo of ``module_db`` by its name (``nn.Linear``)."""
    table: dict[str, Any] = {}
    for info in torch_compat.module_database():
        if info.name in table:
            raise ValueError(f"module_db has two ModuleInfos named {info.name!r}")
        table[info.name] = info
    return table


def module_dtype(info: Any) -> torch.dtype:
    """float32, or the first dtype the ModuleInfo lists when float32 is not among them."""
    dtypes = tuple(info.dtypes)
    return torch.float32 if torch.float32 in dtypes or not dtypes else dtypes[0]


def run_moduleinfo(info: Any, *, max_samples: int | None = MAX_SAMPLES) -> ModuleResult:
    """Check one ModuleInfo's CPU samples, in training and eval mode, with and without requires_grad.

    A mode with more than ``max_samples`` samples is checked on that many, evenly spread over
    all of them (None: every sample). Error inputs are always checked, all of them.
    """
    result = ModuleResult(info.name)
    dtype = module_dtype(info)
    problems = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for training in (True, False):
            for requires_grad in (True, False):
                mode = f"{'train' if training else 'eval'}|{'grad' if requires_grad else 'no_grad'}"
                options = dict(device="cpu", dtype=dtype, requires_grad=requires_grad, training=training)
                try:
                    samples = list(info.module_inputs_func(info, **options))
                except Exception as error:  # the ModuleInfo's own sample generator failed
                    problems.append(f"{mode}: module_inputs_func raised {type(error).__name__}: {_first_line(error)}")
                    continue
                samples = [s for s in samples if s.forward_input is not None]
                for index in _spread(len(samples), max_samples):
                    sample = samples[index]
                    label = f"{mode}|{index} {sample.desc}".rstrip()
                    result.samples.append(check_module_sample(info, sample, dtype, training, label))
                if info.module_error_inputs_func is None:
                    continue
                for index, error_input in enumerate(info.module_error_inputs_func(info, **options)):
                    if not torch_compat.raises_in_forward(error_input):
                        result.construction_errors += 1  # the constructor refuses: no forward to propagate
                        continue
                    sample = error_input.module_error_input
                    label = f"{mode}|error {index} {sample.desc}".rstrip()
                    result.samples.append(check_module_sample(info, sample, dtype, training, label))
    if not result.samples:
        result.skipped = "; ".join(problems) or "the ModuleInfo yields no CPU samples"
    return result



def build_module(info: Any, sample: Any, dtype: torch.dtype, training: bool) -> torch.nn.Module:
    """The module of one sample, as torch's test_modules builds it."""
    constructor = sample.constructor_input
    module = info.module_cls(*constructor.args, **constructor.kwargs)
    module.to(dtype)
    module.train(training)
    return module


def module_graph(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[torch.fx.GraphModule, list]:
    """A graph calling ``module`` once, with a placeholder per forward argument (positional, then
    keyword ones), as `torch.fx.symbolic_trace` of a wrapper would give; returns it and the inputs
    in placeholder order."""
    root = torch.nn.Module()
    root.add_module("module", module)
    graph = torch.fx.Graph()
    positional = tuple(graph.placeholder(f"arg{i}") for i in range(len(args)))
    keywords = {name: graph.placeholder(name) for name in kwargs}
    graph.output(graph.call_module("module", positional, keywords))
    return torch.fx.GraphModule(root, graph), [*args, *kwargs.values()]


def as_user_passes(value: Any, mode: FakeTensorMode) -> Any:
    """A forward input as fxprop is given it: data-free (a FakeTensor) for a floating point tensor of
    one or more dims, real for a tensor whose values fxprop reads (`values_worth_knowing`: integer
    and bool tensors -- indices, lengths, masks -- and 0-dim numbers) and for python values."""
    def convert(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and not values_worth_knowing(leaf):
            return mode.from_tensor(leaf)
        return leaf
    return pytree.tree_map(convert, value)


def check_module_sample(info: Any, sample: Any, dtype: torch.dtype, training: bool, label: str) -> ModuleSampleResult:
    """fxprop and FakeTensorProp on one ModuleInfo sample, each judged against real execution."""
    forward = sample.forward_input
    return check_module_call(lambda: build_module(info, sample, dtype, training), forward.args, forward.kwargs, label)


def check_module_call(build: Callable[[], torch.nn.Module], args: tuple, kwargs: dict | None = None,
                      label: str = "") -> ModuleSampleResult:
    """fxprop and FakeTensorProp on one call of the module ``build()`` makes, each judged against real
    execution. ``build`` runs three times after ``torch.manual_seed(0)``, one module for each (a lazy
    module's uninitialized buffers cannot be deep-copied)."""
    args, kwargs = tuple(args), dict(kwargs or {})

    def built() -> torch.fx.GraphModule:
        torch.manual_seed(0)
        return module_graph(build(), args, kwargs)[0]
    gm, fake_gm, real_gm = built(), built(), built()
    inputs = [*args, *kwargs.values()]
    fxprop_outcome = _fxprop(gm, inputs)
    fake_outcome = _fake_prop(fake_gm, inputs)
    real_error, observed = None, None
    try:
        torch.manual_seed(0)
        recorder = _Recorder(real_gm)
        recorder.run(*inputs)
        observed = recorder.values
    except Exception as error:
        real_error = error
    described = None if real_error is None else f"{type(real_error).__name__}: {_first_line(real_error)}"
    return ModuleSampleResult(label, described,
                              _judge(fxprop_outcome, gm, observed, real_error, True),
                              _judge(fake_outcome, fake_gm, observed, real_error, False),
                              _judge(fake_outcome, fake_gm, observed, real_error, False, check_requires_grad=False))


def _fxprop(gm: torch.fx.GraphModule, inputs: list) -> tuple[str, Any]:
    """("value", None) once every node is annotated, ("error", exception) otherwise; a side effect
    on the user's module or inputs is ("side-effect", message)."""
    fed = as_user_passes(inputs, FakeTensorMode())
    lazy_before = _lazy_state(gm)
    try:
        with assert_no_side_effects(gm, *fed):
            try:
                propagate(gm, *fed, cache=False)
            except Exception as error:
                return "error", error
    except AssertionError as error:
        return "side-effect", str(error)
    if _lazy_state(gm) != lazy_before:
        return "side-effect", f"lazy modules materialized: {lazy_before} -> {_lazy_state(gm)}"
    return "value", None


def _lazy_state(gm: torch.nn.Module) -> list[tuple[str, str, bool]]:
    """Each submodule's class and whether it still holds uninitialized parameters."""
    return [(name, type(module).__name__, _has_uninitialized(module)) for name, module in gm.named_modules()]


def _has_uninitialized(module: torch.nn.Module) -> bool:
    return any(isinstance(t, torch.nn.parameter.UninitializedTensorMixin)
               for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)))


def _fake_prop(gm: torch.fx.GraphModule, inputs: list) -> tuple[str, Any]:
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # the module's parameters and buffers are real
    fed = pytree.tree_map(lambda leaf: mode.from_tensor(leaf) if isinstance(leaf, torch.Tensor) else leaf, inputs)
    try:
        with _quiet_fake_tensor_log():
            FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fed)
    except Exception as error:
        return "error", error
    return "value", None


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """FakeTensorMode logs every meta kernel that raises, with its traceback; the error is the verdict."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _judge(outcome: tuple[str, Any], gm: torch.fx.GraphModule, observed: dict | None,
           real_error: BaseException | None, is_fxprop: bool, check_requires_grad: bool = True) -> Verdict:
    kind, value = outcome
    if kind == "side-effect":
        return Verdict("side-effect", _first_line(Exception(value.replace("\n", " "))))
    if kind == "error":
        return _judge_error(value, real_error, is_fxprop)
    if real_error is not None:
        return Verdict("missed-error", f"real raised {type(real_error).__name__}: {_first_line(real_error)}")
    try:
        mismatches = compare_nodes(gm, observed)
    except Exception as error:  # e.g. a symbolic size that cannot be compared without a guard
        return Verdict("compare-error", f"{type(error).__name__}: {_first_line(error)}")
    if not check_requires_grad:
        mismatches = [m for m in mismatches if not m.field.startswith("requires_grad")]
    if not mismatches:
        return MATCH
    return Verdict(_category(mismatches[0]), "; ".join(_short_at(m) for m in mismatches[:3]))


def _short_at(mismatch: Mismatch) -> str:
    return f"%{mismatch.node} {_short(mismatch)}"


def sweep(keys: Iterable[str] | None = None, *, max_samples: int | None = MAX_SAMPLES,
          progress: Callable[[int, int, str], None] | None = None) -> list[ModuleResult]:
    """`run_moduleinfo` for each key (every ModuleInfo when None), calling ``progress(done, total, key)``."""
    return sweep_table(moduleinfos(), run_moduleinfo, "ModuleInfo", keys, max_samples, progress)
