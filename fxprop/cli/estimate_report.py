"""``fxprop run --estimate``: the estimate's totals and its top nodes as text, and its picture.

>>> import torch, fxprop
>>> est = fxprop.estimate(torch.fx.symbolic_trace(torch.nn.Linear(4, 2)), fxprop.TensorSpec((3, 4)))
>>> print("\\n".join(estimate_lines(est, top=2)))  # doctest: +NORMALIZE_WHITESPACE
estimate
  FLOPs: 48
  peak bytes: cpu 112 B after %linear
  inputs: cpu 48 B; parameters and buffers: cpu 40 B; activation peak: cpu 24 B
<BLANKLINE>
largest allocations (top 2)
node    target  allocated  live after (cpu)
------  ------  ---------  ----------------
linear  linear  24 B       112 B
<BLANKLINE>
most FLOPs (top 2)
node    target  FLOPs  share
------  ------  -----  ------
linear  linear  48     100.0%
"""
from __future__ import annotations

from typing import Any, Sequence

from ..estimate import Estimate
from ..estimate.sizes import is_symbolic
from .report import format_table
from .module_spans import Span, label_at, module_spans

PLOT_HINT = ("--live-bytes-plot (alias --estimate-svg) needs matplotlib, which is not installed: "
             "pip install matplotlib (or the extra: pip install 'fxprop[plot]')")

PLOT_INCHES, PLOT_DPI = (10, 4.5), 100  # a PNG of 1000 x 450 pixels, whatever the user's matplotlibrc says
MAX_MODULE_LABELS = 60  # rotated 7-point labels stop overlapping at about this many across the plot


class PlotError(Exception):
    """The picture of live bytes cannot be drawn (matplotlib missing, or sizes still symbolic)."""


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_formats() -> set[str]:
    """The file extensions matplotlib writes (svg, png, pdf, ...)."""
    from matplotlib.figure import Figure
    return set(Figure().canvas.get_supported_filetypes())


def size_text(size: Any) -> str:
    """Bytes, readable: ``1,536 B``, ``12.50 MiB``; an expression in bytes: ``(64*B + 512) bytes``."""
    if is_symbolic(size):
        return f"({size}) bytes"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.2f} {unit}"
    return f"{size:,} B"


def count_text(flops: Any) -> str:
    if is_symbolic(flops):
        return str(flops)
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if flops >= scale:
            return f"{flops / scale:,.3f} {unit}"
    return f"{flops:,}"


def _per_device(sizes: dict[str, Any]) -> str:
    return ", ".join(f"{device} {size_text(size)}" for device, size in sizes.items()) or "none"


def estimate_lines(est: Estimate, top: int = 10) -> list[str]:
    """Totals, then the ``top`` nodes by new storage and by FLOPs (symbolic counts: totals only)."""
    lines = ["estimate", f"  FLOPs: {count_text(est.flops)}"]
    for device, peak in est.peak_bytes.items():
        node = est.peak_node[device]
        where = f"after %{node}" if node else "after one of " + ", ".join(
            f"%{name} ({size_text(size)})" for name, size in est.peak_candidates[device]) + ", by the sizes"
        lines.append(f"  peak bytes: {device} {size_text(peak)} {where}")
    lines.append(f"  inputs: {_per_device(est.input_bytes)}; parameters and buffers: {_per_device(est.state_bytes)}; "
                 f"activation peak: {_per_device(est.activation_peak_bytes)}")
    for kind, entry in sorted(getattr(est, "comm", {}).items()):
        lines.append(f"  {kind}: {entry['count']} calls, sends {size_text(entry['send_bytes'])}, "
                     f"receives {size_text(entry['receive_bytes'])} per rank")
    if est.saved_for_backward:
        lines.append(f"  saved for backward: {_per_device(est.saved_for_backward_bytes)} "
                     f"({len(est.saved_for_backward)} forward nodes)")
    data_dependent = {name: bounds for name, bounds in est.symbols.items() if bounds.kind != "input"}
    if data_dependent:
        lines.append("  data-dependent sizes: " + ", ".join(f"{name} in [{bounds.lower}, {bounds.upper}]"
                                                             for name, bounds in data_dependent.items()))
    if est.flops_unknown:
        lines.append("  FLOPs not counted (0 assumed): " + ", ".join(f"%{name} ({why})"
                                                                     for name, why in est.flops_unknown.items()))
    if est.is_symbolic:
        lines.append("  (sizes are symbolic: give --estimate-at NAME=SIZE,... to rank the nodes)")
        return lines
    devices = list(est.peak_bytes)
    allocations = [(node.name, node.target, size_text(node.allocated_bytes),
                    *(size_text(node.live_bytes.get(device, 0)) for device in devices))
                   for node in est.largest("allocated_bytes", top)]
    header = ("node", "target", "allocated", *(f"live after ({device})" for device in devices))
    lines += ["", f"largest allocations (top {top})", format_table(header, allocations) if allocations else "  none"]
    total = est.flops or 1
    heavy = [(node.name, node.target, count_text(node.flops), f"{100 * node.flops / total:.1f}%")
             for node in est.largest("flops", top)]
    lines += ["", f"most FLOPs (top {top})",
              format_table(("node", "target", "FLOPs", "share"), heavy) if heavy else "  none"]
    return lines


def parse_sizes(text: str) -> dict[str, int]:
    """``"B=8,T=128"`` -> ``{"B": 8, "T": 128}``."""
    sizes = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, equals, value = part.partition("=")
        if not equals or not name.strip().isidentifier() or not value.strip().isdigit():
            raise ValueError(f"bad size {part!r} in {text!r}: expected NAME=INT,... such as B=8,T=128")
        sizes[name.strip()] = int(value)
    return sizes


def draw_live_bytes(est: Estimate, path: str, title: str = "", labels: Sequence[str | None] = ()) -> None:
    """Live bytes per device across the node order, the peak marked, as an SVG (or any format
    matplotlib knows from the file's extension: ``.png``, ``.pdf``).

    ``labels`` (`fxprop.cli.module_spans.node_labels`, one per node) shades and names the span
    of each module and says which one the peak falls in; SVG text stays text, searchable.
    """
    if est.is_symbolic:
        raise PlotError("--live-bytes-plot (alias --estimate-svg) needs concrete sizes: give --estimate-at "
                        "NAME=SIZE,... for the symbols " + ", ".join(sorted(est.symbols)))
    try:
        import matplotlib
    except ImportError:
        raise PlotError(PLOT_HINT) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure, axes = pyplot.subplots(figsize=PLOT_INCHES)
        positions = {node.name: index for index, node in enumerate(est.nodes)}
        scale, unit = _unit(max(est.peak_bytes.values(), default=0))
        for device, peak in est.peak_bytes.items():
            series = [node.live_bytes.get(device, 0) / scale for node in est.nodes]
            line, = axes.plot(range(len(series)), series, label=f"{device} live", linewidth=1.2)
            resident = est.input_bytes.get(device, 0) + est.state_bytes.get(device, 0)
            axes.axhline(resident / scale, color=line.get_color(), linestyle="--", linewidth=0.8,
                         label=f"{device} inputs + parameters")
            peak_at = positions[est.peak_node[device]]
            module = label_at(labels, peak_at) if labels else ""
            axes.plot([peak_at], [peak / scale], marker="o", color="red")
            axes.annotate(f"peak {size_text(peak)}\n%{est.peak_node[device]}" + (f"\nin {module}" if module else ""),
                          (peak_at, peak / scale), textcoords="offset points", xytext=(8, -4), fontsize=8,
                          color="red", va="top")
        axes.set_ylabel(f"live bytes ({unit})")
        axes.set_xlabel("node (graph order)")
        axes.set_title(title or "live bytes")
        axes.set_ylim(bottom=0)
        axes.set_xlim(-0.5, max(len(est.nodes) - 0.5, 0.5))
        _shade_modules(axes, module_spans(labels))
        axes.legend(loc="lower right")
        figure.tight_layout()
        figure.savefig(path, dpi=PLOT_DPI)
        pyplot.close(figure)


def _shade_modules(axes, spans: list[Span]) -> None:
    """Alternate grey bands, one per module span, each named above the plot (every k-th when crowded)."""
    if not spans:
        return
    for index, span in enumerate(spans):
        axes.axvspan(span.start - 0.5, span.stop + 0.5, color="0.88" if index % 2 else "0.95", zorder=0,
                     linewidth=0)
    named = spans[::-(-len(spans) // MAX_MODULE_LABELS)]
    top = axes.secondary_xaxis("top")
    top.set_ticks([(span.start + span.stop) / 2 for span in named], labels=[span.label for span in named],
                  rotation=90, fontsize=7)
    top.tick_params(length=0, colors="0.3")


def _unit(peak: int) -> tuple[float, str]:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak >= scale:
            return float(scale), unit
    return 1.0, "B"
