"""``fxprop run --estimate``, ``--estimate-at`` and ``--estimate-svg``, driven as a subprocess like test_cli.py."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torch

import fxprop
from fxprop import examples

ROOT = Path(__file__).resolve().parent.parent


def fxprop_cli(*args: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pythonpath, str(ROOT)]))}
    return subprocess.run([sys.executable, "-m", "fxprop", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)


def test_estimate_prints_totals_and_the_top_nodes():
    done = fxprop_cli("run", "fxprop.examples:mlp_example", "--estimate")
    assert done.returncode == 0, done.stderr
    out = done.stdout[done.stdout.index("\nestimate\n"):]
    assert "  FLOPs: 92,160\n" in out
    assert "  peak bytes: cpu 27.54 KiB after %relu\n" in out  # 28,200 bytes
    assert "  inputs: cpu 512 B; parameters and buffers: cpu 23.04 KiB; activation peak: cpu 4.00 KiB\n" in out
    allocations = out[out.index("largest allocations (top 10)"):out.index("most FLOPs")]
    assert allocations.split("\n")[1].split() == ["node", "target", "allocated", "live", "after", "(cpu)"]
    assert re.search(r"^layers_0\s+layers\.0\s+2\.00 KiB\s+25\.54 KiB$", allocations, re.M)
    flops = out[out.index("most FLOPs (top 10)"):]
    assert re.search(r"^layers_1\s+layers\.1\s+65,536\s+71\.1%$", flops, re.M)
    assert len([line for line in flops.splitlines()[3:] if line.strip()]) == 3  # only nodes that compute


def test_json_holds_every_node_record_and_the_picture_marks_the_peak(tmp_path):
    pytest.importorskip("matplotlib", reason="the picture needs the plot extra")
    picture = tmp_path / "live.svg"
    done = fxprop_cli("run", "fxprop.examples:gpt_example", "--estimate", "--format", "json",
                      "--estimate-svg", str(picture))
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    model, inputs = examples.gpt_example()
    expected = fxprop.estimate(torch.fx.symbolic_trace(model), *inputs).to_dict()
    assert document["estimate"] == expected
    assert [node["name"] for node in document["estimate"]["nodes"]] == [node["name"] for node in document["nodes"]]
    assert f"fxprop: wrote {picture}" in done.stderr
    svg = picture.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "%gelu" in svg or "gelu" in svg  # the peak's label


def test_symbolic_estimate_and_its_evaluation():
    done = fxprop_cli("run", "fxprop.examples:mlp_example", "--input", "B,16", "--estimate")
    assert done.returncode == 0, done.stderr
    assert "  FLOPs: 11520*B\n" in done.stdout and "  peak bytes: cpu (576*B + 23592) bytes after %relu\n" in done.stdout
    assert "activation peak: cpu (512*B) bytes" in done.stdout
    assert "give --estimate-at NAME=SIZE" in done.stdout and "largest allocations" not in done.stdout
    done = fxprop_cli("run", "fxprop.examples:mlp_example", "--input", "B,16", "--estimate-at", "B=8",
                      "--format", "json")
    assert done.returncode == 0, done.stderr
    concrete = fxprop_cli("run", "fxprop.examples:mlp_example", "--estimate", "--format", "json")
    assert json.loads(done.stdout)["estimate"] == json.loads(concrete.stdout)["estimate"]


def test_missing_matplotlib_and_bad_sizes_fail_before_any_work(tmp_path):
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    done = fxprop_cli("run", "fxprop.examples:mlp_example", "--estimate-svg", str(tmp_path / "x.svg"),
                      pythonpath=str(tmp_path))
    assert done.returncode == 1 and done.stdout == ""
    assert "--estimate-svg needs matplotlib" in done.stderr and "pip install" in done.stderr
    done = fxprop_cli("run", "fxprop.examples:mlp_example", "--estimate-at", "B8")
    assert done.returncode == 2 and "expected NAME=INT" in done.stderr
