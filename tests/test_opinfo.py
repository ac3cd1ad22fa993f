"""OpInfo conformance: every sample of torch's op_db, propagated by fxprop, matches real execution.

The default run checks `fxprop.conformance.CI_SLICE` (82 ops from every op family).
The whole of op_db runs with one command:

    FXPROP_FULL_SWEEP=1 .venv/bin/python -m pytest tests/test_opinfo.py

Known gaps are strict expected failures from `fxprop.conformance.EXPECTED_FAILURES`: an
entry whose op starts to match fails the test until it is removed.
"""
import os

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

from fxprop import conformance
from fxprop.conformance import CI_SLICE, EXPECTED_FAILURES, expected_failures

FULL_SWEEP = os.environ.get("FXPROP_FULL_SWEEP") == "1"
KEYS = list(conformance.opinfos()) if FULL_SWEEP else list(CI_SLICE)


@pytest.mark.parametrize("key", KEYS)
def test_op_matches_real_execution(key):
    result = conformance.run_opinfo(conformance.opinfos()[key])
    expected = EXPECTED_FAILURES.get(key)
    if result.status == "unverified":
        assert expected is not None and expected.category == "unverified", \
            f"{key} has no sample to check ({result.skipped}): list it in the expected-failure table"
        pytest.xfail(f"unverified: {expected.reason}")
    if expected is None:
        assert result.status == "verified", result.describe_mismatches()
        return
    if result.status == "verified":
        pytest.fail(f"{key} now matches real execution on all {result.total} samples: "
                    "remove it from fxprop/conformance/expected.py")
    pytest.xfail(f"{expected.category}: {expected.reason}")


def test_ci_slice_is_a_list_of_distinct_opinfos():
    assert len(set(CI_SLICE)) == len(CI_SLICE)
    assert set(CI_SLICE) <= set(conformance.opinfos())


def test_expected_failure_table_names_real_opinfos():
    assert set(EXPECTED_FAILURES) <= set(conformance.opinfos())
    assert all(entry.reason.strip() for entry in EXPECTED_FAILURES.values())


def test_expected_failure_table_refuses_duplicates_and_empty_reasons():
    with pytest.raises(ValueError, match="'mm' is listed twice"):
        expected_failures(("mm", "strides", "one"), ("mm", "dtype", "two"))
    with pytest.raises(ValueError, match="'mm' needs a reason"):
        expected_failures(("mm", "strides", " "))
    with pytest.raises(ValueError, match="unknown category 'misc'"):
        expected_failures(("mm", "misc", "why"))


def test_real_errors_must_be_propagation_errors_too():
    sample = SampleInput(torch.randn(2, 3), args=(torch.randn(4, 3),))
    result = conformance.check_sample(torch.mm, sample, torch.float32, 0)
    assert result.real_error.startswith("RuntimeError") and result.fxprop.ok and result.fake.ok


lib = torch.library.Library("fxprop_opinfo_test", "DEF")
lib.define("positive(Tensor x) -> Tensor")
lib.impl("positive", lambda x: x[x > 0].clone(), "CPU")


def test_a_wrong_answer_is_a_mismatch_with_its_field():
    kept = conformance.check_sample(torch.Tensor.t, SampleInput(torch.randn(2, 3)), torch.float32, 0)
    assert kept.fxprop.ok and kept.fake.ok and kept.real_error is None
    # No rule: the host fallback runs on synthesized values, not the sample's.
    guessed = conformance.check_sample(torch.ops.fxprop_opinfo_test.positive,
                                       SampleInput(torch.tensor([-1.0, 2.0, -3.0])), torch.float32, 0)
    assert guessed.fxprop.category == "shape" and guessed.fxprop.detail.startswith("shape expected (1,), got")


@pytest.mark.parametrize("device, saved", [("cpu", (0,)), ("cuda:0", (3,))])
def test_batch_norm_inference_statistics_follow_the_device(device, saved):
    import fxprop
    from fxprop.testing import call_graph
    spec = lambda *shape: fxprop.TensorSpec(shape, device=device)
    gm, inputs = call_graph(torch.ops.aten.native_batch_norm.default,
                            (spec(2, 3, 4), spec(3), spec(3), spec(3), spec(3), False, 0.1, 1e-5), {})
    out, save_mean, save_invstd = fxprop.propagate(gm, *inputs)
    assert tuple(out.shape) == (2, 3, 4) and tuple(save_mean.shape) == tuple(save_invstd.shape) == saved
    assert out.device == torch.device(device)


@pytest.mark.parametrize("device, v_stride", [("cpu", (1, 4)), ("cuda:0", (4, 1))])
def test_meta_kernels_lay_out_results_for_the_nodes_device(device, v_stride):
    import fxprop
    from fxprop.testing import call_graph
    gm, inputs = call_graph(torch.ops.aten._linalg_svd.default, (fxprop.TensorSpec((6, 4), device=device),), {})
    u, s, v = fxprop.propagate(gm, *inputs)
    assert tuple(v.shape) == (4, 4) and v.stride() == v_stride
    assert torch._meta_registrations.device_hint(torch.empty(2, device="meta")) == "cuda"  # outside propagation
