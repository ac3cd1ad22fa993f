"""A corpus of real transformers architectures, traced the ways pipelines trace them, propagated
by fxprop and compared node by node with real execution.

Each model (tests/corpus/models.py) is built offline from a tiny config in code (hidden 32, two
layers, vocab 256, sequence 8; nothing is downloaded) and traced (tests/corpus/harness.py):

- ``export``: the ``torch.export.ExportedProgram`` itself, ``fxprop.propagate(ep, *inputs)``,
  compared on ``ep.graph_module``;
- ``module``: ``ep.module()`` (also cross-checked with `fxprop.testing.assert_matches_real`);
- ``module_spec``: ``ep.module()`` propagated from `fxprop.TensorSpec` inputs;
- ``dynamo``: ``torch._dynamo.export``, the torch-level graph of torch.compile's frontend;
- ``fx``: ``torch.fx.symbolic_trace`` (transformers 5 no longer ships ``transformers.utils.fx``).

A run passes when fxprop annotated every node and every value (shape, dtype, device,
significant strides, requires_grad) and the output equal a real run, and propagation had no side
effects: parameters, buffers, constants and inputs unchanged (bits and version counters), the
global RNG state (``torch.get_rng_state()``), grad mode and the graph's code unchanged.

Runs that cannot pass are listed in tests/corpus/known_failures.py with the reason: fxprop's
bugs are ``xfail(strict=True)`` (they fail the suite once fixed, so the entry gets removed);
runs torch itself cannot trace or execute are skipped with the reason. A run that fails and is
not listed fails the test, whoever's fault it is: the list must stay honest.

By default only the CI slice runs (`CI_SLICE` in tests/corpus/models.py, a handful of the most
representative models, under two minutes on two CPU cores). The full corpus, every model with
traces export, module, dynamo and fx (about 20 minutes)::

    FXPROP_CORPUS=all pytest tests/test_corpus.py

``FXPROP_CORPUS=llama,t5`` runs those models (every default trace); ``FXPROP_CORPUS_TRACES=all``
adds ``module_spec``.

Training graphs (tests/corpus/training.py): with the model in train mode, AOT's forward and
backward graphs under ``torch.compile`` (``aot``: static; ``aot_dynamic``: ``dynamic=True``,
called twice with different batch and sequence sizes, fxprop's symbolic sizes evaluated at each
call's) and the ``make_fx`` joint graph of the loss and its gradients (``joint``), every node
compared with a real run of that graph, and no guard added to dynamo's ShapeEnv. By default the
slice `TRAINING_SLICE` of tests/corpus/models.py runs; ``FXPROP_CORPUS_TRAINING=all`` (or
``=llama,t5``) runs every model (or those) with the three traces, as
``python tools/corpus_sweep.py --training`` does. ``python tools/corpus_sweep.py`` runs the same sweep and prints a markdown
table per architecture and trace (nodes, result, seconds).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

pytest.importorskip("transformers")

import torch

from corpus.harness import DEFAULT_TRACES, NOT_FXPROP, OK, TRACES, TRAINING_TRACES, check_case
from corpus.known_failures import KNOWN_FAILURES, is_fxprop_bug, key
from corpus.models import CASES, CI_SLICE, CI_TRACES, TRAINING_SLICE

FAMILIES = ("decoder", "encoder", "encoder-decoder", "vision", "audio", "multimodal", "state-space")


def _selection() -> list[tuple[str, str]]:
    wanted = os.environ.get("FXPROP_CORPUS", "").strip()
    traces = os.environ.get("FXPROP_CORPUS_TRACES", "").strip()
    traces = list(TRACES) if traces == "all" else [t for t in traces.split(",") if t] or list(DEFAULT_TRACES)
    if not wanted:
        return [(name, trace) for name in CI_SLICE for trace in CI_TRACES.get(name, ("export", "module"))]
    names = list(CASES) if wanted == "all" else [n.strip() for n in wanted.split(",") if n.strip()]
    return [(name, trace) for name in names for trace in traces]   # model-major: one export per model


def _param(name: str, trace: str):
    reason = KNOWN_FAILURES.get(key(name, trace))
    marks = []
    if reason is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=reason) if is_fxprop_bug(reason)
                     else pytest.mark.skip(reason=reason))
    return pytest.param(name, trace, marks=marks, id=f"{name}-{trace}")


def _training_selection() -> list[tuple[str, str]]:
    wanted = os.environ.get("FXPROP_CORPUS_TRAINING", "").strip()
    if not wanted:
        return [(name, trace) for name, traces in TRAINING_SLICE.items() for trace in traces]
    names = list(CASES) if wanted == "all" else [n.strip() for n in wanted.split(",") if n.strip()]
    return [(name, trace) for name in names for trace in TRAINING_TRACES]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name,trace", [_param(n, t) for n, t in _selection()])
def test_corpus(name: str, trace: str) -> None:
    outcome = check_case(name, trace)
    if outcome.status == OK:
        if trace == "module":  # the public test kit agrees on the same graph
            from fxprop.testing import assert_matches_real
            from corpus.harness import _exported
            _model, inputs, program, _error = _exported(name)
            assert_matches_real(program.module(), *inputs.values())
        return
    where = "torch/transformers" if outcome.status in NOT_FXPROP else "fxprop"
    mismatches = "".join(f"\n  {m}" for m in outcome.mismatches[:20])
    pytest.fail(f"{name}/{trace} [{where}] {outcome.short()}{mismatches}\n"
                f"(not in tests/corpus/known_failures.py: fix it, or add it there with the reason)")


@pytest.mark.parametrize("name,trace", [_param(n, t) for n, t in _training_selection()])
def test_corpus_training(name: str, trace: str) -> None:
    """AOT's forward and backward graphs (static, and dynamic over two real calls of different
    sizes) and the make_fx joint graph of a model in train mode: every node as real execution
    has it, and no guard added to dynamo's ShapeEnv (tests/corpus/training.py)."""
    outcome = check_case(name, trace)
    if outcome.status == OK:
        return
    where = "torch/transformers" if outcome.status in NOT_FXPROP else "fxprop"
    mismatches = "".join(f"\n  {m}" for m in outcome.mismatches[:20])
    pytest.fail(f"{name}/{trace} [{where}] {outcome.short()}{mismatches}\n"
                f"(not in tests/corpus/known_failures.py: fix it, or add it there with the reason)")


def test_corpus_covers_the_families() -> None:
    assert len({c.model_type for c in CASES.values()}) >= 40
    assert {c.family for c in CASES.values()} == set(FAMILIES)
    assert set(CI_SLICE) <= set(CASES)
    assert {CASES[n].family for n in CI_SLICE} >= {"decoder", "encoder", "encoder-decoder", "vision", "audio"}


def test_known_failures_name_real_runs() -> None:
    for entry, reason in KNOWN_FAILURES.items():
        model, _, trace = entry.partition("/")
        assert model in CASES and trace in TRACES + TRAINING_TRACES, entry
        assert reason.strip(), entry
