"""The reviewed table of ModuleInfos on which fxprop knowingly disagrees with real execution.

Built with the same `expected_failures` as the OpInfo table (duplicate keys, empty reasons and
unknown categories are refused). Keys are ModuleInfo names (``nn.GaussianNLLLoss``). Each
reason is torch's: why the answer needs something a static pass is not given. The conformance
test treats an entry as a strict expected failure: when the module starts to match on every
sample, the test fails until the entry is removed. The coverage report prints the same reasons.
"""
from __future__ import annotations

from .expected import ExpectedFailure, expected_failures

EXPECTED_MODULE_FAILURES: dict[str, ExpectedFailure] = expected_failures(
)
