"""tools/coverage_report.py: the three modes, the output formats and the CI gate."""
import csv
import importlib.util
import io
import json
import pathlib
import subprocess
import sys

import pytest
import torch

import fxprop
from fxprop import examples

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "coverage_report.py"
spec = importlib.util.spec_from_file_location("coverage_report", SCRIPT)
coverage_report = importlib.util.module_from_spec(spec)
sys.modules["coverage_report"] = coverage_report
spec.loader.exec_module(coverage_report)


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = coverage_report.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_every_aten_overload_is_listed_with_the_engines_lookup():
    code, out, _ = run("--format", "json")
    report = json.loads(out)
    kinds = {row["op"]: row["kind"] for row in report["rows"]}
    assert len(kinds) == report["summary"]["targets"] > 2000
    aten = torch.ops.aten
    for op in (aten.addmm.default, aten.convolution.default, aten.nonzero.default, aten.add.Tensor):
        assert kinds[str(op)] == fxprop.lookup(op).kind.value
    assert kinds["aten.convolution.default"] == "python"
    assert sum(report["summary"].get(k, 0) for k in coverage_report.KINDS) == report["summary"]["targets"]
    assert kinds["torch.ops.higher_order.cond"] == fxprop.lookup(torch.ops.higher_order.cond).kind.value
    assert code == 0


def test_an_op_with_neither_a_meta_nor_a_host_kernel_is_unsupported():
    _, out, _ = run("--format", "json")
    kinds = {row["op"]: row["kind"] for row in json.loads(out)["rows"]}
    assert kinds["aten._cudnn_ctc_loss.default"] == fxprop.lookup(torch.ops.aten._cudnn_ctc_loss.default).kind.value
    assert fxprop.lookup(torch.ops.aten._cudnn_ctc_loss.default).kind != "fallback"


def test_kind_filter_and_fail_on_fallback():
    code, out, err = run("--kind", "fallback", "--format", "csv", "--fail-on-fallback")
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["op", "kind", "rule"] and all(row[1] == "fallback" for row in rows[1:])
    assert code == 1 and "need the real-tensor fallback" in err and "summary" in err


def test_model_mode_lists_each_node_and_how_it_was_covered():
    code, out, _ = run("--model", "fxprop.examples:gpt_example", "--fail-on-fallback")
    assert code == 0
    assert "scaled_dot_product_attention" in out and "aten.addmm.default" in out or "aten.linear.default" in out
    assert "summary" in out and "fallback bytes  0" in out


def test_model_mode_gate_fails_on_a_fallback_node(tmp_path, monkeypatch):
    (tmp_path / "fallback_model.py").write_text(
        "import torch\n"
        "lib = torch.library.Library('fxprop_report_test', 'DEF')\n"
        "lib.define('double(Tensor x) -> Tensor')\n"
        "lib.impl('double', lambda x: x * 2, 'CPU')\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.ops.fxprop_report_test.double(x).relu()\n"
        "def make():\n"
        "    return M(), (torch.ones(3),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run("--model", "fallback_model:make", "--trace", "symbolic", "--format", "md",
                         "--fail-on-fallback")
    assert code == 1 and "| double | fxprop_report_test.double | fallback |" in out
    assert "1 op(s)/node(s) need the real-tensor fallback" in err


@pytest.mark.parametrize("keep_example_inputs", [True, False])
def test_graph_mode_reads_a_saved_program(tmp_path, keep_example_inputs):
    model, inputs = examples.mlp_example()
    path = tmp_path / "mlp.pt2"
    program = torch.export.export(model, inputs)
    if not keep_example_inputs:
        program.example_inputs = None  # then the placeholders' shapes are the inputs
    torch.export.save(program, str(path))
    code, out, _ = run("--graph", str(path), "--format", "json")
    report = json.loads(out)
    assert code == 0 and {row["op"] for row in report["rows"]} >= {"aten.linear.default", "aten.relu.default"}
    assert report["summary"]["fallback"] == 0


def test_verify_mode_marks_ops_and_shows_both_rates():
    code, out, err = run("--verify", "--ops", "mm,nonzero", "--max-samples", "3", "--format", "json")
    report = json.loads(out)
    status = {row["op"]: row for row in report["rows"]}
    assert status["mm"]["status"] == "verified" and status["mm"]["fxprop"].startswith("6/6")
    assert status["nonzero"]["FakeTensorMode"].startswith("0/")
    assert report["summary"]["ops"] == 2 and "FakeTensorMode match rate" in report["summary"]
    assert "verify: 2/2 ops (100%)" in err  # progress on stderr


def test_script_runs_from_a_shell():
    done = subprocess.run([sys.executable, str(SCRIPT), "--verify", "--ops", "add", "--max-samples", "2",
                           "--no-progress"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "add" in done.stdout and "verified" in done.stdout and "verify:" not in done.stderr


def test_verify_modules_mode_shows_fxprop_and_fake_tensor_prop_both_ways():
    code, out, err = run("--verify-modules", "--modules", "nn.Linear,nn.GaussianNLLLoss", "--max-samples", "1",
                         "--format", "json")
    report = json.loads(out)
    rows = {row["module"]: row for row in report["rows"]}
    assert rows["nn.Linear"]["status"] == "verified" and rows["nn.Linear"]["samples"] == 4
    assert rows["nn.Linear"]["FakeTensorProp, requires_grad not compared"] == "4/4 (100.0%)"
    assert rows["nn.GaussianNLLLoss"]["expected failure"].startswith("F.gaussian_nll_loss")
    assert report["summary"]["mismatched modules not in the expected-failure table"] == 0
    assert "verify: 2/2 modules (100%)" in err and code == 0
