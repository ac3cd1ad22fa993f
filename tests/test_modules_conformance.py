"""ModuleInfo conformance: every sample of torch's module_db, propagated by fxprop, matches real execution.

The default run checks `fxprop.conformance.modules.MODULE_CI_SLICE` with a few samples per mode.
The whole of module_db runs with one command:

    FXPROP_FULL_SWEEP=1 .venv/bin/python -m pytest tests/test_modules_conformance.py

Known gaps are strict expected failures from `fxprop.conformance.expected_modules`: an entry
whose module starts to match fails the test until it is removed.
"""
import os

import pytest
import torch
from torch import nn

from fxprop.conformance import modules
from fxprop.conformance.expected_modules import EXPECTED_MODULE_FAILURES, REFUSALS

FULL_SWEEP = os.environ.get("FXPROP_FULL_SWEEP") == "1"
KEYS = list(modules.moduleinfos()) if FULL_SWEEP else list(modules.MODULE_CI_SLICE)
SLICE_SAMPLES = 6  # per module, training mode and requires_grad in the default run


@pytest.mark.parametrize("key", KEYS)
def test_module_matches_real_execution(key):
    result = modules.run_moduleinfo(modules.moduleinfos()[key],
                                    max_samples=modules.MAX_SAMPLES if FULL_SWEEP else SLICE_SAMPLES)
    expected = EXPECTED_MODULE_FAILURES.get(key)
    assert result.status != "unverified", f"{key} has no sample to check ({result.skipped})"
    if expected is None:
        assert result.status == "verified", result.describe_mismatches()
        return
    if result.status == "verified":
        pytest.fail(f"{key} now matches real execution on all {result.total} samples: "
                    "remove it from fxprop/conformance/expected_modules.py")
    refusal = REFUSALS[expected.category]
    wrong = [s for s in result.fxprop_mismatches() if not s.fxprop.detail.startswith(refusal)]
    assert not wrong, f"{key}: samples missed otherwise than by {refusal}:\n" + result.describe_mismatches()
    pytest.xfail(f"{expected.category}: {expected.reason}")


def test_slice_and_table_name_real_moduleinfos():
    assert len(set(modules.MODULE_CI_SLICE)) == len(modules.MODULE_CI_SLICE)
    assert set(modules.MODULE_CI_SLICE) <= set(modules.moduleinfos())
    assert set(EXPECTED_MODULE_FAILURES) <= set(modules.moduleinfos())
    assert all(entry.category in REFUSALS for entry in EXPECTED_MODULE_FAILURES.values())


# --- each fix, against real execution -----------------------------------------------------------

def _matches(build, *args, **kwargs):
    result = modules.check_module_call(build, args, kwargs)
    assert result.fxprop.ok, result
    return result


def test_a_lazy_module_infers_its_parameters_on_its_shadow_only():
    for training in (True, False):
        _matches(lambda: nn.LazyConv2d(5, 3).train(training), torch.randn(2, 4, 3, 4, requires_grad=True))
    _matches(lambda: nn.LazyConvTranspose1d(3, 2), torch.randn(4, 5))
    lazy = nn.LazyLinear(3)
    from fxprop.resolve.call_graphs import call_graph
    import fxprop
    gm, inputs = call_graph(lazy, (torch.randn(2, 7),), {})
    assert tuple(fxprop.propagate(gm, *inputs).shape) == (2, 3)
    assert type(lazy) is nn.LazyLinear and lazy.has_uninitialized_params() and lazy._forward_pre_hooks


def test_batch_norm_with_a_cumulative_average_reads_its_known_counter():
    result = _matches(lambda: nn.BatchNorm1d(10, momentum=None).train(), torch.randn(4, 10))
    assert result.real_error is None


def test_transformer_encoder_decides_the_causal_mask_check_from_a_real_mask():
    layer = lambda: nn.TransformerEncoderLayer(d_model=4, nhead=2, dim_feedforward=8, dropout=0.0)
    mask = torch.tensor([False, False, True]).expand(3, 3)
    causal = torch.ones(3, 3, dtype=torch.bool).triu(1)
    for given in (mask, causal, torch.zeros(3, 3, dtype=torch.bool)):
        _matches(lambda: nn.TransformerEncoder(layer(), 2), torch.randn(3, 4), mask=given)
    # A float mask's values are data, not given to a static pass: the check cannot be decided.
    float_mask = modules.check_module_call(lambda: nn.TransformerEncoder(layer(), 2), (torch.randn(3, 4),),
                                           {"mask": nn.Transformer.generate_square_subsequent_mask(3)})
    assert float_mask.fxprop.detail.startswith("DataDependentError"), float_mask
    padding = torch.tensor([[False, False, True], [False, True, True]])
    _matches(lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(4, 2, 8, 0.0, batch_first=True), 1).eval(),
             torch.randn(2, 3, 4), src_key_padding_mask=padding)


def test_an_embedding_index_out_of_range_is_refused_like_real_execution():
    result = _matches(lambda: nn.Embedding(10, 3), torch.tensor([0, 5, 15]))
    assert result.real_error.startswith("IndexError")
    _matches(lambda: nn.Embedding(10, 3), torch.tensor([0, 5, 9]))
    assert _matches(lambda: nn.Embedding(10, 3), torch.tensor([-1])).real_error.startswith("IndexError")


@pytest.mark.parametrize("build, args", [
    (lambda: nn.MaxPool2d(2), (torch.randn(3, 4),)),
    (lambda: nn.CrossEntropyLoss(weight=torch.rand(2)), (torch.randn(2, 3), torch.tensor([0, 2]))),
], ids=["max_pool_2d_of_2d", "cross_entropy_weight_of_2_for_3_classes"])
def test_refusals_carry_real_executions_error_type(build, args):
    result = _matches(build, *args)
    assert result.real_error.startswith("RuntimeError")


def test_ctc_loss_with_list_lengths_is_fxprops_limit_never_the_models_error():
    log_probs = torch.randn(50, 3, 15).log_softmax(2)
    targets = torch.randint(1, 15, (3, 30), dtype=torch.int32)
    result = modules.check_module_call(nn.CTCLoss, (log_probs, targets, (50, 50, 50), (30, 25, 20)))
    assert result.real_error is None and result.fxprop.detail.startswith("UnsupportedError"), result
    _matches(lambda: nn.CTCLoss(reduction="sum"), log_probs, targets, (50, 50, 50), (30, 25, 20))
    _matches(nn.CTCLoss, log_probs, targets, torch.tensor((50, 50, 50)), torch.tensor((30, 25, 20)))
