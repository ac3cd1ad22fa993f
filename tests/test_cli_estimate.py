"""``fxprop run --estimate``, ``--estimate-at`` and ``--live-bytes-plot``, driven as a subprocess like test_cli.py."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from xml.etree import ElementTree

import pytest

import torch

import fxprop
from fxprop import examples
from fxprop.cli import estimate_report

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


def svg_texts(path: Path) -> list[str]:
    """Every text element of an SVG that matplotlib wrote (fonttype none: text, not glyph paths)."""
    return [element.text or "" for element in ElementTree.parse(path).iter("{http://www.w3.org/2000/svg}text")]


def test_json_holds_every_node_record_and_the_picture_marks_the_peak(tmp_path):
    pytest.importorskip("matplotlib", reason="the picture needs the plot extra")
    picture = tmp_path / "live.svg"
    done = fxprop_cli("run", "fxprop.examples:gpt_example", "--estimate", "--format", "json",
                      "--estimate-svg", str(picture))  # the old name of --live-bytes-plot
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    model, inputs = examples.gpt_example()
    expected = fxprop.estimate(torch.fx.symbolic_trace(model), *inputs).to_dict()
    assert document["estimate"] == expected
    assert [node["name"] for node in document["estimate"]["nodes"]] == [node["name"] for node in document["nodes"]]
    assert f"fxprop: wrote {picture}" in done.stderr
    assert picture.read_text().lstrip().startswith("<?xml")
    texts = svg_texts(picture)
    assert f"%{expected['peak_node']['cpu']}" in texts and "peak 607.25 KiB" in texts


def gpt_live_bytes_svg(tmp_path: Path, *options: str) -> list[str]:
    picture = tmp_path / "live.svg"
    done = fxprop_cli("run", "fxprop.examples:gpt_example", "--live-bytes-plot", str(picture), *options)
    assert done.returncode == 0, done.stderr
    assert "\nestimate\n" in done.stdout  # the plot implies --estimate
    return svg_texts(picture)


def test_the_plot_names_the_peak_its_module_the_units_and_each_layer(tmp_path):
    pytest.importorskip("matplotlib", reason="the picture needs the plot extra")
    model, inputs = examples.gpt_example()
    gm = torch.fx.symbolic_trace(model)
    est = fxprop.estimate(gm, *inputs)
    peak = est.peak_node["cpu"]
    layer = next(node for node in gm.graph.nodes if node.name == peak).meta["nn_module_stack"]
    layer = ".".join(list(layer.values())[-1][0].split(".")[:2])  # the peak's module, cut at the layers' depth
    texts = gpt_live_bytes_svg(tmp_path)
    assert {f"peak {estimate_report.size_text(est.peak_bytes['cpu'])}", f"%{peak}", f"in {layer}"} <= set(texts)
    assert "live bytes (KiB)" in texts and "node (graph order)" in texts
    assert [text for text in texts if text in {"wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"}] == \
        ["wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"]  # one label per layer, in order
    assert "h.0.attn" not in texts


def test_module_depth_chooses_the_marks(tmp_path):
    pytest.importorskip("matplotlib", reason="the picture needs the plot extra")
    deeper = gpt_live_bytes_svg(tmp_path, "--module-depth", "3")
    assert {"h.0.attn", "h.0.fc", "h.1.attn", "lm_head"} <= set(deeper) and "in h.0" in deeper
    unmarked = gpt_live_bytes_svg(tmp_path, "--module-depth", "0")
    assert not {"h.0", "h.0.attn", "wte"} & set(unmarked) and not any(t.startswith("in ") for t in unmarked)
    assert "live bytes (KiB)" in unmarked and any(t.startswith("peak ") for t in unmarked)
    done = fxprop_cli("run", "fxprop.examples:gpt_example", "--live-bytes-plot", "x.svg", "--module-depth", "two")
    assert done.returncode == 2 and "expected a module depth 0, 1, 2, ..., got 'two'" in done.stderr


def test_a_png_plot_by_its_extension(tmp_path):
    pytest.importorskip("matplotlib", reason="the picture needs the plot extra")
    from matplotlib import image
    picture = tmp_path / "live.png"
    done = fxprop_cli("run", "fxprop.examples:cnn_example", "--live-bytes-plot", str(picture))
    assert done.returncode == 0, done.stderr
    header = picture.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    width, height = (int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big"))
    (x_inches, y_inches), dpi = estimate_report.PLOT_INCHES, estimate_report.PLOT_DPI
    assert (width, height) == (x_inches * dpi, y_inches * dpi) == (1000, 450)
    assert image.imread(picture).shape[:2] == (height, width)


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
    assert "--live-bytes-plot (alias --estimate-svg) needs matplotlib" in done.stderr
    assert "pip install" in done.stderr
    done = fxprop_cli("run", "fxprop.examples:mlp_example", "--estimate-at", "B8")
    assert done.returncode == 2 and "expected NAME=INT" in done.stderr
