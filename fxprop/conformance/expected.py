"""The reviewed table of OpInfos on which fxprop knowingly disagrees with real execution.

Each entry names one OpInfo by its key (``name`` or ``name.variant``), a category and the
reason. `expected_failures` refuses duplicate keys and empty reasons, so the table cannot
silently lose an entry the way a dict literal would. The conformance test treats an entry
as a strict expected failure: when the op starts to match, the test fails until the entry
is removed. The coverage report prints the same reasons.
"""
from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = ("data-dependent", "layout", "unverified", "strides", "shape", "dtype", "requires_grad", "error",
              "no-meta-path")


@dataclass(frozen=True)
class ExpectedFailure:
    key: str
    category: str
    reason: str


def expected_failures(*entries: tuple[str, str, str]) -> dict[str, ExpectedFailure]:
    """Build the table from ``(key, category, reason)`` triples; a repeated key is an error."""
    table: dict[str, ExpectedFailure] = {}
    for key, category, reason in entries:
        if key in table:
            raise ValueError(f"expected-failure table: {key!r} is listed twice "
                             f"({table[key].reason!r} and {reason!r})")
        if category not in CATEGORIES:
            raise ValueError(f"expected-failure table: {key!r} has unknown category {category!r}; "
                             f"use one of {', '.join(CATEGORIES)}")
        if not reason.strip():
            raise ValueError(f"expected-failure table: {key!r} needs a reason")
        table[key] = ExpectedFailure(key, category, reason)
    return table


_NO_CPU_DTYPES = "the OpInfo lists no CPU dtypes: its kernels exist only for CUDA/ROCm, so no CPU sample runs"

EXPECTED_FAILURES: dict[str, ExpectedFailure] = expected_failures(
    # The answer depends on the values, which a static pass does not have: fxprop raises
    # DataDependentError (an unsupported case, never a refusal counted as right). FakeTensorMode
    # fails on these samples too.
    ("narrow", "data-dependent",
     "samples whose start is a 0-dim tensor: the start is read with item() and becomes an unbacked "
     "symbol, which the slice meta kernel cannot bound"),
    ("tensor_split", "data-dependent",
     "samples that split at a tensor of indices: the split points are values, which torch's kernel "
     "reads on the host"),
    ("nn.functional.one_hot", "data-dependent",
     "with num_classes=-1 the class count is max(input) + 1, a value the output's size needs"),
    ("istft", "data-dependent",
     "the C++ composite checks the window envelope's values (the NOLA condition) before it "
     "computes any shape, so every sample needs data"),
    ("nn.functional.gaussian_nll_loss", "data-dependent",
     "the python function branches on torch.any(var < 0), which depends on the values"),
    ("linalg.lstsq", "data-dependent",
     "with the gelss and gelsd drivers the residuals exist only when the matrix has full rank, "
     "which depends on the values (no meta kernel; fxprop says so rather than ask synthesized data)"),
    ("linalg.lstsq.grad_oriented", "data-dependent",
     "the same op as linalg.lstsq, through a wrapper: residuals depend on the matrix's rank"),
    # Inputs fxprop does not take.
    ("sparse.sampled_addmm", "layout", "sparse CSR inputs: fxprop propagates strided tensors only"),
    ("sparse.mm.reduce", "layout", "sparse CSR inputs: fxprop propagates strided tensors only"),
    # Results fxprop does not make.
    ("to_sparse", "layout", "a sparse COO result: fxprop propagates strided tensors only (refused, not answered strided)"),
    # Nothing to check on a CPU-only host.
    ("torch.ops.aten._flash_attention_forward", "unverified", _NO_CPU_DTYPES),
    ("torch.ops.aten._efficient_attention_forward", "unverified", _NO_CPU_DTYPES),
    ("nn.functional.batch_norm.without_cudnn", "unverified", _NO_CPU_DTYPES),
)
