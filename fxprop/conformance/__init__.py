"""OpInfo conformance: fxprop and FakeTensorMode, each compared with real execution.

For every OpInfo in torch's ``op_db`` the sweep takes CPU samples in two dtypes (float32, and
one integer or bool dtype the op supports; see `sample_dtypes`), and for each sample:

    real      run the op on the sample's real tensors, keep the metadata of its result
    fxprop    build a one-node FX graph calling the op (`fxprop.testing.call_graph`) and
              propagate it from data-free inputs (FakeTensors: shape, stride, dtype, device,
              requires_grad, no values)
    fake      run the op under torch's FakeTensorMode on the same data-free inputs (the anchor)

and compares shape, dtype, significant strides, device and requires_grad (float samples
require grad when the op supports autograd). Values are never compared, so random and
nondeterministic ops are checked by metadata only.

When the real op raises for a sample, the correct static answer is an error too: fxprop
must raise `PropagationError` (and FakeTensorMode any exception) to count as a match.

>>> from fxprop import conformance
>>> result = conformance.run_opinfo(conformance.opinfos()["mm"], max_samples=2)
>>> result.status, result.fxprop_matches == result.total
('verified', True)
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from .. import torch_compat
from ..torch_compat import FakeTensorMode, pytree

from ..engine.propagation import propagate
from ..errors import PropagationError
from ..testing import Mismatch, call_graph, compare_values, observe
from .expected import EXPECTED_FAILURES, ExpectedFailure, expected_failures

__all__ = ["CI_SLICE", "EXPECTED_FAILURES", "MAX_SAMPLES", "ExpectedFailure", "OpResult", "SampleResult", "Verdict",
           "expected_failures", "op_key", "opinfos", "run_opinfo", "sample_dtypes", "sweep"]

MAX_SAMPLES = 64  # per op and dtype, spread evenly over all of the op's samples
INTEGER_DTYPES = (torch.int64, torch.int32, torch.bool, torch.uint8, torch.int16, torch.int8)
FLOAT_FALLBACK_DTYPES = (torch.float64, torch.complex64, torch.bfloat16, torch.float16, torch.float8_e4m3fn)

# The representative slice the default test run checks: 82 ops from every op family.
CI_SLICE = (
    # elementwise
    "abs", "exp", "sigmoid", "neg", "ceil", "logical_not", "bitwise_not", "add", "mul", "div.no_rounding_mode",
    "div.floor_rounding", "pow", "maximum", "eq", "where", "bitwise_and", "clamp",
    # reductions and scans
    "sum", "mean", "amax", "argmax", "std", "var_mean", "cumsum", "logsumexp", "max.reduction_with_dim",
    # views and shape
    "view", "reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "narrow", "select", "flatten",
    "split", "unbind", "as_strided", "__getitem__", "cat", "stack", "repeat", "flip", "roll", "tril",
    # linear algebra
    "mm", "bmm", "matmul", "addmm", "einsum", "linalg.vector_norm",
    # neural network
    "nn.functional.conv2d", "nn.functional.linear", "softmax", "nn.functional.layer_norm",
    "nn.functional.batch_norm", "nn.functional.avg_pool2d", "nn.functional.embedding", "nn.functional.gelu",
    "nn.functional.dropout", "nn.functional.scaled_dot_product_attention", "nn.functional.cross_entropy",
    "nn.functional.pad.constant", "nn.functional.interpolate.bilinear",
    # indexing, sorting
    "index_select", "gather", "scatter", "index_add", "masked_fill", "sort", "topk",
    # data-dependent output shapes
    "nonzero", "masked_select", "unique",
    # factories and conversions
    "zeros_like", "full_like", "new_zeros", "arange", "to", "clone", "contiguous",
)


@dataclass(frozen=True)
class Verdict:
    """One checker's answer on one sample. ``category`` names what went wrong (None: it matched)."""
    category: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.category is None


MATCH = Verdict()


@dataclass(frozen=True)
class SampleResult:
    dtype: torch.dtype
    index: int
    real_error: str | None
    fxprop: Verdict
    fake: Verdict


class Tally:
    """What an OpInfo's or a ModuleInfo's samples add up to (``samples``: their results, each with
    an ``fxprop`` and a ``fake`` `Verdict`)."""
    samples: list

    @property
    def total(self) -> int:
        return len(self.samples)

    @property
    def fxprop_matches(self) -> int:
        return sum(s.fxprop.ok for s in self.samples)

    @property
    def fake_matches(self) -> int:
        return sum(s.fake.ok for s in self.samples)

    @property
    def status(self) -> str:
        if not self.samples:
            return "unverified"
        return "verified" if self.fxprop_matches == self.total else "mismatched"

    def fxprop_mismatches(self) -> list:
        return [s for s in self.samples if not s.fxprop.ok]

    def categories(self) -> list[str]:
        return sorted({s.fxprop.category for s in self.fxprop_mismatches()})


@dataclass
class OpResult(Tally):
    """Every sample of one OpInfo. ``skipped`` says why no sample ran (the op is then unverified)."""
    key: str
    samples: list[SampleResult] = field(default_factory=list)
    skipped: str | None = None
    dtypes: tuple[torch.dtype, ...] = ()


    def describe_mismatches(self, limit: int = 5) -> str:
        lines = [f"{self.key}: fxprop matched {self.fxprop_matches}/{self.total} samples "
                 f"(FakeTensorMode {self.fake_matches}/{self.total})"]
        for sample in self.fxprop_mismatches()[:limit]:
            dtype = str(sample.dtype).removeprefix("torch.")
            lines.append(f"  sample {sample.index} ({dtype}) [{sample.fxprop.category}]: {sample.fxprop.detail}")
        hidden = len(self.fxprop_mismatches()) - limit
        if hidden > 0:
            lines.append(f"  ... and {hidden} more")
        return "\n".join(lines)


def op_key(opinfo: Any) -> str:
    """The table key of an OpInfo: its name, and its variant after a dot (``div.floor_rounding``)."""
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


@functools.lru_cache(maxsize=None)
def opinfos() -> dict[str, Any]:
    """Every OpInfo of ``op_db`` by `op_key` (importing op_db takes a few seconds)."""
    op_db = torch_compat.opinfo_database()
    table: dict[str, Any] = {}
    for opinfo in op_db:
        key = op_key(opinfo)
        if key in table:
            raise ValueError(f"op_db has two OpInfos with the key {key!r}")
        table[key] = opinfo
    return table


def sample_dtypes(opinfo: Any) -> tuple[torch.dtype, ...]:
    """float32 (or, for ops without it, the first of float64/complex64/bfloat16/float16/float8 they
    support), and the first of int64/int32/bool/uint8/int16/int8 they support."""
    supported = opinfo.supported_dtypes("cpu")
    floating = next((d for d in (torch.float32, *FLOAT_FALLBACK_DTYPES) if d in supported), None)
    integer = next((d for d in INTEGER_DTYPES if d in supported), None)
    return tuple(d for d in (floating, integer) if d is not None)


def run_opinfo(opinfo: Any, *, max_samples: int | None = MAX_SAMPLES) -> OpResult:
    """Check the CPU samples of one OpInfo in the dtypes of `sample_dtypes`.

    An op with more than ``max_samples`` samples in a dtype is checked on that many, evenly
    spread over all of them (None: every sample); a few OpInfos yield thousands.
    """
    result = OpResult(op_key(opinfo), dtypes=sample_dtypes(opinfo))
    if not result.dtypes:
        result.skipped = "no float, integer or bool dtype on CPU"
        return result
    problems = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in result.dtypes:
            requires_grad = opinfo.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
            try:
                samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad))
            except Exception as error:  # the OpInfo's own sample generator failed
                problems.append(f"{dtype}: sample_inputs raised {type(error).__name__}: {_first_line(error)}")
                continue
            for index in _spread(len(samples), max_samples):
                result.samples.append(check_sample(opinfo.op, samples[index], dtype, index))
    if not result.samples:
        result.skipped = "; ".join(problems) or "the OpInfo yields no CPU samples"
    return result


def _spread(count: int, limit: int | None) -> list[int]:
    if limit is None or count <= limit:
        return list(range(count))
    return sorted({i * count // limit for i in range(limit)})


def check_sample(op: Callable, sample: Any, dtype: torch.dtype, index: int) -> SampleResult:
    args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
    fxprop_verdict = _fxprop(op, args, kwargs)
    fake_verdict = _fake(op, args, kwargs)
    real_error, observed = None, None
    try:
        observed = observe(op(*args, **kwargs))
    except Exception as error:
        real_error = error
    described = None if real_error is None else f"{type(real_error).__name__}: {_first_line(real_error)}"
    return SampleResult(dtype, index, described, _judge(fxprop_verdict, observed, real_error, True),
                        _judge(fake_verdict, observed, real_error, False))


def _data_free(args: tuple, kwargs: dict, mode: FakeTensorMode) -> tuple[tuple, dict]:
    def convert(value):
        return mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
    return pytree.tree_map(convert, (args, kwargs))


def _fxprop(op: Callable, args: tuple, kwargs: dict) -> Any:
    """fxprop's result, or the exception it raised."""
    try:
        free_args, free_kwargs = _data_free(args, kwargs, FakeTensorMode())
        gm, inputs = call_graph(op, free_args, free_kwargs)
        return ("value", propagate(gm, *inputs, cache=False))
    except Exception as error:
        return ("error", error)


def _fake(op: Callable, args: tuple, kwargs: dict) -> Any:
    mode = FakeTensorMode()
    try:
        fake_args, fake_kwargs = _data_free(args, kwargs, mode)
        with mode:
            return ("value", op(*fake_args, **fake_kwargs))
    except Exception as error:
        return ("error", error)


def _judge(outcome: tuple[str, Any], observed: Any, real_error: BaseException | None, is_fxprop: bool) -> Verdict:
    """A refusal matches only when it is the same refusal as real execution's: for fxprop, a
    `PropagationError` carrying real execution's exception type; for FakeTensorMode, an exception
    of that type. fxprop's own failures (`InternalError`, `UnsupportedError`) never match."""
    kind, value = outcome
    if kind == "error":
        return _judge_error(value, real_error, is_fxprop)
    if real_error is not None:
        return Verdict("missed-error", f"real raised {type(real_error).__name__}: {_first_line(real_error)}")
    try:
        mismatches = compare_values(value, observed, node="op", op="")
    except Exception as error:  # e.g. a symbolic size that cannot be compared without a guard
        return Verdict("compare-error", f"{type(error).__name__}: {_first_line(error)}")
    if not mismatches:
        return MATCH
    return Verdict(_category(mismatches[0]), "; ".join(_short(m) for m in mismatches[:3]))


def _judge_error(error: BaseException, real_error: BaseException | None, is_fxprop: bool) -> Verdict:
    """The verdict on a checker that raised ``error`` where real execution raised ``real_error`` (or nothing)."""
    described = f"{type(error).__name__}: {_first_line(error)}"
    if real_error is None:
        return Verdict("raised", described)
    real = f"{type(real_error).__name__}: {_first_line(real_error)}"
    same = error.refuses_like(real_error) if isinstance(error, PropagationError) else (
        not is_fxprop and type(error) is type(real_error))
    if same:
        return MATCH
    if isinstance(error, PropagationError):
        described = f"PropagationError({error.error_type.__name__}): {_first_line(error)}"
    return Verdict("wrong-error", f"real raised {real}; got {described}")


def _category(mismatch: Mismatch) -> str:
    return mismatch.field.split("[")[0]


def _short(mismatch: Mismatch) -> str:
    return f"{mismatch.field} expected {mismatch.expected}, got {mismatch.got}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= 160 else line[:157] + "..."


def sweep(keys: Iterable[str] | None = None, *, max_samples: int | None = MAX_SAMPLES,
          progress: Callable[[int, int, str], None] | None = None) -> list[OpResult]:
    """`run_opinfo` for each key (every OpInfo when None), calling ``progress(done, total, key)``."""
    return sweep_table(opinfos(), run_opinfo, "OpInfo", keys, max_samples, progress)


def sweep_table(table: dict, run: Callable, kind: str, keys: Iterable[str] | None, max_samples: int | None,
                progress: Callable[[int, int, str], None] | None) -> list:
    """``run(table[key], max_samples=...)`` for each key (every entry when None), with progress."""
    keys = list(table) if keys is None else list(keys)
    unknown = [key for key in keys if key not in table]
    if unknown:
        raise KeyError(f"no {kind} named {', '.join(unknown)}")
    results = []
    for done, key in enumerate(keys):
        if progress is not None:
            progress(done, len(keys), key)
        results.append(run(table[key], max_samples=max_samples))
    if progress is not None:
        progress(len(keys), len(keys), "")
    return results
