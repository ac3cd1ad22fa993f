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
    assert code == coverage_report.EXIT_FALLBACK == 3 and "need the real-tensor fallback" in err and "summary" in err


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
    assert code == 3 and "| double | fxprop_report_test.double | fallback |" in out
    assert "1 op(s)/node(s) need the real-tensor fallback" in err


CUSTOM_OP_MODEL = """
import torch

@torch.library.custom_op("fxprop_report_test::triple_no_fake", mutates_args=())
def triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3  # a CPU implementation and no fake kernel: torch.export cannot run it

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)

    def forward(self, x):
        return triple(self.fc(x)).relu()

def make():
    return M(), (torch.ones(2, 4),)
"""

DATA_DEPENDENT_MODEL = """
import torch

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:  # python control flow on a tensor's value: export and symbolic_trace refuse it
            return y.relu()
        return y.neg()

def make():
    torch.manual_seed(0)
    return M(), (torch.ones(2, 4),)
"""


def model_module(tmp_path, monkeypatch, name, text):
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_a_custom_op_without_fake_kernel_falls_back_to_symbolic_trace(tmp_path, monkeypatch):
    module = model_module(tmp_path, monkeypatch, "no_fake_kernel_model", CUSTOM_OP_MODEL)
    model, inputs = module.make()
    expected = tuple(model.fc(*inputs).shape)
    code, out, err = run("--model", "no_fake_kernel_model:make", "--format", "json", "--fail-on-fallback")
    report = json.loads(out)
    summary = report["summary"]
    assert summary["trace"] == "torch.fx.symbolic_trace" and "(torch.fx.symbolic_trace)" in report["title"]
    assert summary["trace fallback"].startswith("torch.export failed: RuntimeError: There was no fake impl "
                                                "registered for <CustomOpDef(fxprop_report_test::triple_no_fake)>")
    rows = {row["op"]: row for row in report["rows"]}
    custom = rows["fxprop_report_test.triple_no_fake.default"]
    assert custom["kind"] == "fallback" and custom["fallback bytes"] > 0 and custom["shape"] == str(expected)
    assert summary["fallback"] == 1
    assert code == 3 and "1 op(s)/node(s) need the real-tensor fallback" in err
    assert run("--model", "no_fake_kernel_model:make")[0] == 0  # without the gate: a report, not a failure


@pytest.mark.parametrize("fmt", ["table", "md", "csv"])
def test_every_format_names_the_trace_and_why(tmp_path, monkeypatch, fmt):
    model_module(tmp_path, monkeypatch, f"no_fake_kernel_{fmt}", CUSTOM_OP_MODEL.replace("triple_no_fake",
                                                                                          f"triple_no_fake_{fmt}"))
    code, out, err = run("--model", f"no_fake_kernel_{fmt}:make", "--format", fmt)
    summary = err if fmt == "csv" else out  # csv keeps stdout for rows
    assert code == 0
    assert "trace fallback" in summary and "torch.export failed: RuntimeError: There was no fake impl" in summary
    assert f"triple_no_fake_{fmt}.default" in out and "fallback" in out


def test_python_control_flow_on_tensor_values_falls_back_to_dynamo(tmp_path, monkeypatch, capsys):
    module = model_module(tmp_path, monkeypatch, "data_dependent_model", DATA_DEPENDENT_MODEL)
    model, inputs = module.make()
    taken = model(*inputs)  # the branch real execution takes
    code, out, err = run("--model", "data_dependent_model:make", "--format", "json", "--fail-on-fallback")
    report = json.loads(out)
    summary = report["summary"]
    assert code == 0, err
    assert summary["trace"] == "dynamo (torch.compile)" and summary["graphs"] == 2
    export_failed, symbolic_failed = summary["trace fallback"].split("; ")
    assert export_failed.startswith("torch.export failed: GuardOnDataDependentSymNode: Could not guard on "
                                    "data-dependent expression")
    assert symbolic_failed == ("torch.fx.symbolic_trace failed: TraceError: symbolically traced variables cannot "
                               "be used as inputs to control flow")
    rows = {row["node"]: row for row in report["rows"]}
    branch = "Tensor.relu" if bool(taken.min() >= 0) else "Tensor.neg"
    after_break = [row for name, row in rows.items() if name.startswith("g1.")]
    assert [row["op"] for row in after_break] == [branch] and after_break[0]["shape"] == str(tuple(taken.shape))
    assert "def forward" not in capsys.readouterr().err  # export's partial graph is not printed over the report


def test_a_named_tracer_is_the_only_one_tried(tmp_path, monkeypatch):
    model_module(tmp_path, monkeypatch, "data_dependent_only", DATA_DEPENDENT_MODEL)
    code, out, err = run("--model", "data_dependent_only:make", "--trace", "symbolic")
    assert code == 1 and out == ""
    assert err.startswith("coverage_report: no tracer could trace M: torch.fx.symbolic_trace failed: TraceError")
    assert "torch.export" not in err


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
