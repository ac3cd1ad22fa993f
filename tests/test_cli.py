"""The command line, driven as a subprocess (``python -m fxprop ...``) the way people and CI run it.

Each subprocess imports torch (seconds), so the cases are few and each checks several things.
The DOT output is read back into a networkx DiGraph by the small reader below, which knows
the subset of DOT that fxprop writes: quoted ids, ``[key="value", ...]`` lists, clusters.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
import torch

import fxprop
from fxprop.cli.loading import parse_input_spec

ROOT = Path(__file__).resolve().parent.parent


def fxprop_cli(*args: str, path: str | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "fxprop", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


_ID = r'"((?:[^"\\]|\\.)*)"'
_ATTRS = re.compile(r'(\w+)=' + _ID)


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def read_dot(text: str) -> nx.DiGraph:
    """Nodes, edges and their attributes; a node's ``cluster`` is the subgraph it was declared in."""
    graph, cluster = nx.DiGraph(), None
    for line in text.splitlines():
        line = line.strip()
        if found := re.fullmatch(r"subgraph " + _ID + r" \{", line):
            cluster = _unquote(found[1])
        elif line == "}":
            cluster = None
        elif found := re.fullmatch(_ID + r" -> " + _ID + r" \[(.*)\];", line):
            attrs = {k: _unquote(v) for k, v in _ATTRS.findall(found[3])}
            graph.add_edge(_unquote(found[1]), _unquote(found[2]), **attrs)
        elif found := re.fullmatch(_ID + r" \[(.*)\];", line):
            graph.add_node(_unquote(found[1]), cluster=cluster, **{k: _unquote(v) for k, v in _ATTRS.findall(found[2])})
    return graph


def test_demo_prints_both_models_and_a_summary():
    done = fxprop_cli("demo")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "GPT-2-style transformer" in out and "ResNet-style CNN" in out
    assert re.search(r"^lm_head\s+call_module:lm_head\s+python\s+\(2, 16, 512\)\s+float32\s+cpu\s+models\.py:\d+",
                     out, re.M)
    assert out.count("summary") == 2 and "device transfers: 0" in out and "fallback: 0 nodes" in out


def test_run_json_schema_dot_read_back_and_fail_on_fallback(tmp_path):
    dot_file = tmp_path / "tiny.dot"
    done = fxprop_cli("run", "tests.cli_models:tiny", "--format", "json", "--dot", str(dot_file), "--fail-on-fallback")
    assert done.returncode == 3, done.stderr  # the output is still written, then the fallback fails the run
    assert re.search(r"1 node\(s\) fell back.*\n  %gap call_function:gap .* at .*cli_models\.py:\d+", done.stderr)
    document = json.loads(done.stdout)
    assert document["schema_version"] == 1
    assert document["graph"] == {"origin": "tests.cli_models:tiny", "trace": "fx"}
    assert document["inputs"] == [{"shape": [2, 8], "dtype": "float32", "device": "cpu"}]
    node_keys = {"name", "op", "target", "args", "kind", "rule", "device_rule", "via", "fallback_bytes", "outputs",
                 "value", "module", "source"}
    nodes = {node["name"]: node for node in document["nodes"]}
    assert all(set(node) == node_keys for node in nodes.values())
    assert nodes["layers_1_fc"]["outputs"] == [{"shape": [2, 8], "dtype": "float32", "device": "cpu", "stride": [8, 1]}]
    assert nodes["layers_1_fc"]["module"] == "layers.1.fc" and nodes["layers_1_fc"]["args"] == ["add"]
    assert nodes["to"]["kind"] == "meta" and nodes["to"]["device_rule"] == "Tensor.to"
    assert nodes["to"]["via"].startswith("aten._to_copy.default") and nodes["to"]["outputs"][0]["device"] == "cuda:0"
    assert nodes["layers_1_fc"]["kind"] == "python" and nodes["layers_1_fc"]["via"] == "fxprop.rules.linalg.addmm"
    assert nodes["gap"]["kind"] == "fallback" and nodes["gap"]["fallback_bytes"] > 0
    assert nodes["gap"]["source"]["file"].endswith("cli_models.py") and "gap(x, 2)" in nodes["gap"]["source"]["code"]
    summary = document["summary"]
    assert set(summary) >= {"nodes", "kinds", "fallback_bytes", "fallback_nodes", "device_transfers", "symbols",
                            "assumptions", "cache", "seconds"}
    assert summary["nodes"] == len(nodes) and sum(summary["kinds"].values()) == len(nodes)
    assert [f["node"] for f in summary["fallback_nodes"]] == ["gap"]
    assert [(t["node"], t["from"], t["to"]) for t in summary["device_transfers"]] == [("to", ["cpu"], "cuda:0")]

    graph = read_dot(dot_file.read_text())
    drawn = {name for name in graph if not name.startswith("legend_")}
    assert drawn == set(nodes)
    assert {(u, v) for u, v in graph.edges} == {(arg, name) for name, node in nodes.items() for arg in node["args"]}
    assert graph.edges["add", "layers_1_fc"]["label"] == "(2, 8)"
    transfer = graph.edges["add_1", "to"]
    assert "cpu -> cuda:0" in transfer["label"] and transfer["style"] == "bold"
    colour = lambda name: graph.nodes[name]["fillcolor"]
    assert graph.nodes["gap"]["penwidth"] == "3" and colour("gap") == colour("legend_fallback")
    assert colour("relu_1") == colour("legend_meta") and colour("to") == colour("legend_meta")
    assert graph.nodes["relu"]["cluster"] == "cluster_layers.0"
    assert graph.nodes["relu_1"]["cluster"] == "cluster_layers.1" and graph.nodes["to"]["cluster"] is None


def test_run_with_input_specs_table_progress_and_collapsed_picture(tmp_path):
    dot_file = tmp_path / "collapsed.dot"
    done = fxprop_cli("run", "tests.cli_models:tiny_module", "--input", "3,8:float32@cpu", "--collapse",
                      "--dot", str(dot_file), "--progress", "always")
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[2].split()
    assert header == ["node", "op", "rule", "kind", "shape", "dtype", "device", "source"]
    assert re.search(r"^to\s+call_method:to\s+meta\s+\(3, 8\)\s+float32\s+cuda:0\s+cli_models\.py:\d+  x = x\.to",
                     done.stdout, re.M)
    assert "device transfers: 1" in done.stdout and "%to: cpu -> cuda:0" in done.stdout
    assert re.search(r"propagating 11 nodes \.\.\. done in [\d.]+ s", done.stderr)
    graph = read_dot(dot_file.read_text())
    assert "layers.0-1" in graph and "Layer x2" in graph.nodes["layers.0-1"]["label"]
    assert not any(name.startswith(("relu", "layers_")) for name in graph)
    assert graph.has_edge("x", "layers.0-1") and graph.has_edge("layers.0-1", "to")
    assert graph.edges["layers.0-1", "to"]["style"] == "bold"


def test_run_saved_export_program_as_markdown(tmp_path):
    model, (x,) = fxprop.examples.mlp_example()
    saved = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(saved))
    done = fxprop_cli("run", "--graph", str(saved), "--format", "md")
    assert done.returncode == 0, done.stderr
    assert "| node | op | rule kind | shape | dtype | device | source |" in done.stdout
    assert re.search(r"^\| linear_2 \| call_function:linear\.default \| python \| \(8, 10\) \| float32 \| cpu \|",
                     done.stdout, re.M)
    assert "**Summary**" in done.stdout


def test_propagation_error_names_node_and_source_line():
    done = fxprop_cli("run", "tests.cli_models:broken")
    assert done.returncode == 1 and done.stdout == ""
    assert "%matmul" in done.stderr and "shape=(3, 4)" in done.stderr
    assert "cli_models.py" in done.stderr and "y @ torch.ones(5, 2)" in done.stderr


def test_usage_errors_exit_2():
    done = fxprop_cli("run", "no_such_package.models:make")
    assert done.returncode == 2 and "cannot import module 'no_such_package.models'" in done.stderr
    done = fxprop_cli("run", "tests.cli_models:tiny_module", "--input", "2,-8")
    assert done.returncode == 2 and "argument --input" in done.stderr and "bad dim '-8'" in done.stderr


def test_svg_without_graphviz_says_how_to_get_it(tmp_path):
    python_only = str(Path(sys.executable).parent)
    done = fxprop_cli("run", "tests.cli_models:tiny", "--svg", str(tmp_path / "g.svg"), path=python_only)
    assert done.returncode == 1 and "apt-get install graphviz" in done.stderr and "--dot" in done.stderr
    assert not (tmp_path / "g.svg").exists()


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (apt-get install graphviz)")
def test_svg_with_graphviz(tmp_path):
    svg = tmp_path / "g.svg"
    done = fxprop_cli("run", "tests.cli_models:tiny", "--svg", str(svg))
    assert done.returncode == 0, done.stderr
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg")) and "layers_1_fc" in svg.read_text()


def test_input_spec_parsing():
    spec = parse_input_spec("8,16:int64@cuda:0")
    assert (spec.shape, spec.dtype, spec.device) == ((8, 16), torch.int64, torch.device("cuda", 0))
    assert parse_input_spec("4").shape == (4,) and parse_input_spec("4").dtype == torch.float32
    assert parse_input_spec(":float16").shape == ()
    for bad, message in [("2,x-1", "bad dim"), ("2,8@", "missing device"), ("2:float33", "unknown dtype"),
                         ("2@gpu:0", "unknown device")]:
        with pytest.raises(ValueError, match=message):
            parse_input_spec(bad)


def test_symbolic_input_spec_is_passed_to_tensorspec():
    """Names are handed to TensorSpec as strings, which takes them as symbolic dims."""
    spec = parse_input_spec("B,T:int64")
    assert [str(d) for d in spec.shape] == ["B", "T"] and spec.dtype == torch.int64
