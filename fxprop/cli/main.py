"""fxprop's command line: ``fxprop demo``, ``fxprop run`` and ``fxprop estimate``.

Exit codes: 0 ok; 1 the model or a file failed (message on stderr, with the node and source
line for a propagation error); 2 usage error; 3 ``--fail-on-fallback`` and some node fell back.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import torch

from .. import examples, torch_compat
from ..engine.propagation import DEFAULT_FALLBACK_LIMIT_BYTES, propagate
from ..errors import FxpropError
from ..estimate import estimate
from .report import summarize
from . import drawing, estimate_report, meshes, module_spans, will_it_fit
from .formats import FORMATS, render
from .loading import LoadError, Loaded, UsageError, from_callable, from_exported, parse_input_spec, trace_module
from .progress import Progress

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FALLBACK = 0, 1, 2, 3

EPILOG = """examples:
  fxprop demo
  fxprop run fxprop.examples:gpt_example
  fxprop run mypkg.models:make_model --input "B,T:int64@cuda:0" --format json
  fxprop run --graph program.pt2 --svg graph.svg --collapse
  fxprop run fxprop.examples:gpt_example --live-bytes-plot live.svg --module-depth 3
  fxprop estimate llama num_hidden_layers=80 hidden_size=8192 ... --seq 8192 --train --gpu-memory 80GB
exit codes: 0 ok, 1 error (stderr names the node and source line), 2 usage, 3 --fail-on-fallback tripped"""


def _input_spec(text: str):
    try:
        return parse_input_spec(text)
    except Exception as error:  # argparse hides a ValueError's message; keep ours
        raise argparse.ArgumentTypeError(str(error)) from None


def _mesh(text: str):
    try:
        return meshes.parse_mesh(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _sizes(text: str) -> dict[str, int]:
    try:
        return estimate_report.parse_sizes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _depth(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a module depth 0, 1, 2, ..., got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fxprop", description="Static shape, dtype, device and stride "
                                     "inference over torch.fx graphs.", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="propagate the built-in transformer and CNN and print every node")
    run = commands.add_parser("run", help="propagate a model of yours and print what every node becomes",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("target", nargs="?", metavar="MODULE:CALLABLE",
                     help="returns a module or GraphModule, alone or as (model, inputs)")
    run.add_argument("--graph", metavar="FILE",
                     help="a program saved with torch.export.save, instead of MODULE:CALLABLE")
    run.add_argument("--input", dest="inputs", action="append", type=_input_spec, default=[], metavar="SPEC",
                     help="one graph input, 'D0,D1,...[:dtype][@device]' (dims: ints or names such as B), "
                          "e.g. 'B,T:int64@cuda:0'; repeat once per input; overrides the callable's inputs")
    run.add_argument("--trace", choices=("fx", "export"), default="fx",
                     help="how to trace a plain module: torch.fx.symbolic_trace (fx, default) or torch.export "
                          "(aten level)")
    run.add_argument("--param-device", metavar="DEVICE", help="device of parameters that live on the meta device")
    run.add_argument("--fallback-limit", type=int, default=DEFAULT_FALLBACK_LIMIT_BYTES, metavar="BYTES",
                     help="cap on bytes the real-tensor fallback may materialize per op")
    run.add_argument("--fail-on-fallback", action="store_true",
                     help=f"exit {EXIT_FALLBACK} (after the output) when any node fell back to real tensors")
    run.add_argument("--estimate", action="store_true",
                     help="also estimate FLOPs and peak live bytes per device (fxprop.estimate): totals, the top-10 "
                          "memory and FLOP nodes; with --format json, every node's record")
    run.add_argument("--estimate-at", type=_sizes, metavar="NAME=SIZE,...",
                     help="evaluate a symbolic estimate at these sizes, e.g. B=8,T=128 (implies --estimate)")
    run.add_argument("--live-bytes-plot", "--estimate-svg", dest="live_bytes_plot", metavar="FILE",
                     help="draw live bytes across the node order, the peak marked and each module's span shaded "
                          "and named; SVG, PNG or PDF by the extension (needs matplotlib; implies --estimate)")
    run.add_argument("--mesh", type=_mesh, metavar="NAME=SIZE,...",
                     help="propagate one rank of the model parallelized on a simulated mesh, e.g. dp=8,tp=8 "
                          "(implies --estimate: the rank's memory, FLOPs and collectives)")
    run.add_argument("--plan", metavar="tp|MODULE:NAME",
                     help="--mesh: tp (tensor and sequence parallel for Llama-style models) or a plan of yours: "
                          "a parallelize_module dict or a callable plan(model, mesh); a dp dim shards parameters as FSDP")
    run.add_argument("--rank", type=int, default=0, help="--mesh: the rank to propagate (default 0)")
    run.add_argument("--mesh-device", default="cuda", metavar="TYPE",
                     help="--mesh: the device type of the simulated mesh (default cuda)")
    run.add_argument("--module-depth", type=_depth, metavar="N",
                     help="--live-bytes-plot: mark modules N names deep (h.0.attn is 3 deep; 0: no marks; "
                          "default: the depth of the repeated layers, such as h.0 or model.layers.0)")
    fit = commands.add_parser("estimate", help="will a transformers causal LM fit on a device, for a forward pass or "
                              "a training step: memory and FLOPs, built on the meta device",
                              description=will_it_fit.DESCRIPTION, epilog=will_it_fit.EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    will_it_fit.add_arguments(fit)
    fit.set_defaults(subparser=fit)
    demo.add_argument("--format", choices=("table", "md"), default="table", help="output on stdout (default: table)")
    run.add_argument("--format", choices=FORMATS, default="table", help="output on stdout (default: table)")
    for sub in (demo, run):
        sub.set_defaults(subparser=sub)
        sub.add_argument("--dot", metavar="FILE", help="write the annotated graph as Graphviz DOT text")
        sub.add_argument("--svg", metavar="FILE", help="render the annotated graph as SVG (needs graphviz's dot)")
        sub.add_argument("--collapse", action="store_true",
                         help="draw each repeated block (h.0, h.1, ...) as one node, identical runs merged")
        sub.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                         help="stage progress on stderr (auto: graphs of 500+ nodes, when stderr is a terminal)")
    return parser


def _unwritable_outputs(args: argparse.Namespace) -> str | None:
    """Why a file the command would write at the end cannot be written, said before any work."""
    for option in ("dot", "svg", "live_bytes_plot"):
        path = getattr(args, option, None)
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            return f"--{option.replace('_', '-')} {path}: the folder {folder} does not exist"
        if option == "live_bytes_plot":
            extension = os.path.splitext(path)[1].lstrip(".").lower()
            formats = estimate_report.plot_formats()
            if extension not in formats:
                return (f"--live-bytes-plot {path}: matplotlib writes no {extension or 'extensionless'!r} files; "
                        f"give one of {', '.join(sorted(formats))}")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unparsed = parser.parse_known_args(argv)
    if getattr(args, "command", None) == "estimate":
        # KEY=VALUE overrides may follow options too: ``llama --seq 16 hidden_size=32``
        args.overrides += [item for item in unparsed if will_it_fit.is_override(item)]
        unparsed = [item for item in unparsed if not will_it_fit.is_override(item)]
    if unparsed:
        args.subparser.error(f"unrecognized arguments: {' '.join(unparsed)}")
    if getattr(args, "svg", None) and not drawing.have_dot():  # say so now, not after a long propagation
        print(f"fxprop: error: {drawing.GRAPHVIZ_HINT}", file=sys.stderr)
        return EXIT_ERROR
    if getattr(args, "live_bytes_plot", None) and not estimate_report.have_matplotlib():
        print(f"fxprop: error: {estimate_report.PLOT_HINT}", file=sys.stderr)
        return EXIT_ERROR
    unwritable = _unwritable_outputs(args)
    if unwritable:
        print(f"fxprop: error: {unwritable}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "estimate":
            return will_it_fit.run(args)
        return demo(args) if args.command == "demo" else run(args)
    except UsageError as error:
        args.subparser.error(str(error))  # exits 2, after the usage line
    except (LoadError, FxpropError, drawing.GraphvizError, estimate_report.PlotError) as error:
        message = str(error)
        print(message if message.startswith("fxprop:") else f"fxprop: error: {message}", file=sys.stderr)
    except BrokenPipeError:  # e.g. `fxprop demo | head`: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_ERROR


def run(args: argparse.Namespace) -> int:
    if bool(args.target) == bool(args.graph):
        raise UsageError("give either MODULE:CALLABLE or --graph FILE")
    if args.mesh is not None:
        return run_on_mesh(args)
    progress = Progress(args.progress == "always")
    with progress:
        progress.stage(f"loading {args.graph or args.target}")
        loaded = (from_exported(args.graph, args.inputs) if args.graph
                  else from_callable(args.target, args.inputs, args.trace))
        progress.done()
    return propagate_loaded(loaded, args, progress)


def run_on_mesh(args: argparse.Namespace) -> int:
    """One rank of the callable's model, parallelized by ``--plan`` on a simulated ``--mesh``."""
    from ..distributed.meshes import mesh_simulation
    if args.graph:
        raise UsageError("--mesh parallelizes a module: give MODULE:CALLABLE, not --graph")
    shape, names = args.mesh
    meshes.check_rank(args.rank, shape)
    args.estimate = True  # the rank's memory, FLOPs and collectives are the point
    with mesh_simulation(shape, names, device_type=args.mesh_device, rank=args.rank) as mesh:
        loaded = from_callable(args.target, args.inputs, args.trace,
                               prepare=lambda model: meshes.trace(meshes.parallelize(model, mesh, args.plan)))
        title = (f"{loaded.origin} on a simulated {' x '.join(f'{n}={s}' for n, s in zip(names, shape))} "
                 f"{args.mesh_device} mesh, rank {args.rank} (plan {args.plan or 'none'}), {len(loaded.gm.graph.nodes)} nodes")
        return propagate_loaded(loaded, args, title=title)


def propagate_loaded(loaded: Loaded, args: argparse.Namespace, progress: Progress | None = None,
                     title: str | None = None) -> int:
    gm = loaded.gm
    nodes = len(gm.graph.nodes)
    if progress is None or not progress.enabled:
        progress = Progress.choose(args.progress, nodes)
    torch_compat.import_dynamo()  # keep FakeTensorMode's lazy import out of the timing
    with progress:
        progress.stage(f"propagating {nodes:,} nodes")
        started = time.perf_counter()
        propagate(gm, *loaded.inputs, param_device=getattr(args, "param_device", None),
                  fallback_limit_bytes=getattr(args, "fallback_limit", DEFAULT_FALLBACK_LIMIT_BYTES),
                  progress=progress.advance if progress.enabled else None)
        seconds = time.perf_counter() - started
        progress.done()
        summary = summarize(gm, seconds)
        title = title or f"{loaded.origin} ({_trace_name(loaded.trace)}), {nodes} nodes"
        found = None
        if _wants_estimate(args):
            progress.stage("estimating")
            found = estimate(gm)  # reads the annotations just written
            if getattr(args, "estimate_at", None):
                found = found.evaluate(args.estimate_at)
            progress.done()
        print(render(args.format, gm, summary, title, loaded.origin, loaded.trace, loaded.inputs, found))
        written = []
        if args.dot or args.svg:
            progress.stage("drawing")
            written = draw(gm, args, title)
            progress.done()
        if getattr(args, "live_bytes_plot", None):
            depth = getattr(args, "module_depth", None)
            labels = module_spans.node_labels(gm, depth) if depth != 0 else ()
            estimate_report.draw_live_bytes(found, args.live_bytes_plot, f"live bytes: {title}", labels)
            written.append(args.live_bytes_plot)
    for path in written:
        print(f"fxprop: wrote {path}", file=sys.stderr)
    fell_back = summary["fallback_nodes"]
    if getattr(args, "fail_on_fallback", False) and fell_back:
        print(f"fxprop: --fail-on-fallback: {len(fell_back)} node(s) fell back to real tensors "
              f"({summary['fallback_bytes']:,} bytes):", file=sys.stderr)
        for item in fell_back:
            where = item["source"]
            at = f" at {where['file']}:{where['line']}: {where['code']}" if where else ""
            print(f"  %{item['node']} {item['op']} ({item['rule']}, {item['fallback_bytes']:,} bytes){at}",
                  file=sys.stderr)
        return EXIT_FALLBACK
    return EXIT_OK


def _wants_estimate(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in ("estimate", "estimate_at", "live_bytes_plot"))


def _trace_name(trace: str) -> str:
    return {"fx": "torch.fx.symbolic_trace", "export": "torch.export", "given": "GraphModule"}.get(trace, trace)


def draw(gm: torch.fx.GraphModule, args: argparse.Namespace, title: str) -> list[str]:
    graph = drawing.annotated_graph(gm)
    if args.collapse:
        graph = drawing.collapse_blocks(graph)
    text = drawing.to_dot(graph, title)
    written = []
    for path, write in ((args.dot, _write_text), (args.svg, drawing.render_svg)):
        if path:
            write(text, path)
            written.append(path)
    return written


def _write_text(text: str, path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _suffixed(path: str, suffix: str) -> str:
    if not suffix:
        return path
    stem, dot, extension = path.rpartition(".")
    return f"{stem}-{suffix}.{extension}" if dot else f"{path}-{suffix}"


def demo(args: argparse.Namespace) -> int:
    """The built-in GPT-2-style transformer and ResNet-style CNN; no downloads."""
    gpt, gpt_inputs = examples.gpt_example()
    cnn, cnn_inputs = examples.cnn_example(channels_last=True)
    runs = [("gpt", gpt, gpt_inputs, "GPT-2-style transformer (symbolic_trace), tokens int64 "
             f"{tuple(gpt_inputs[0].shape)} on cpu"),
            ("cnn", cnn, cnn_inputs, f"ResNet-style CNN (symbolic_trace), channels_last image "
             f"{tuple(cnn_inputs[0].shape)} on cpu")]
    for i, (name, model, inputs, title) in enumerate(runs):
        if i:
            print()
        loaded = Loaded(trace_module(model, inputs, "fx"), inputs, f"fxprop.examples:{name}_example", "fx")
        graph_args = argparse.Namespace(**{**vars(args), "dot": args.dot and _suffixed(args.dot, name),
                                           "svg": args.svg and _suffixed(args.svg, name)})
        propagate_loaded(loaded, graph_args, title=title)
    return EXIT_OK
