"""The reviewed table of ModuleInfos on which fxprop knowingly disagrees with real execution.

Built with the same `expected_failures` as the OpInfo table (duplicate keys, empty reasons and
unknown categories are refused). Keys are ModuleInfo names (``nn.GaussianNLLLoss``). Each
reason is torch's: why the answer needs something a static pass is not given. Every sample
fxprop misses on such a module must be one of fxprop's own refusals of the entry's kind
(`REFUSALS`), never a wrong answer. The conformance test treats an entry as a strict expected
failure: when the module starts to match on every sample, the test fails until the entry is
removed. The coverage report prints the same reasons.
"""
from __future__ import annotations

from .expected import ExpectedFailure, expected_failures

# The refusal each category allows on a missed sample (the start of the verdict's detail).
REFUSALS = {"data-dependent": "DataDependentError", "no-meta-path": "UnsupportedError"}

EXPECTED_MODULE_FAILURES: dict[str, ExpectedFailure] = expected_failures(
    ("nn.GaussianNLLLoss", "data-dependent",
     "F.gaussian_nll_loss branches on torch.any(var < 0): the values of the float var input, which a "
     "static pass is not given (fxprop reads the values of real integer, bool and 0-dim inputs only); "
     "FakeTensorProp fails on every sample too"),
    ("nn.CTCLoss", "no-meta-path",
     "with python lists of lengths and reduction='mean' (the default), torch's C++ composite for "
     "ctc_loss.IntList builds a tensor from target_lengths with at::tensor, writing its memory: no meta "
     "or fake tensor can run it, and it decomposes below anything a python rule sees (FakeTensorProp "
     "fails on every CTCLoss sample); tensor lengths and the other reductions are checked"),
)
