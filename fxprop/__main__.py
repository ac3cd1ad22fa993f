"""`python -m fxprop demo`: propagate the built-in examples and print every annotated node."""
from __future__ import annotations

import argparse
import sys

import torch

from . import examples, propagate
from .report import NODE_HEADER, format_table, node_rows


def demo() -> int:
    gpt, (tokens,) = examples.gpt_example()
    gm = torch.fx.symbolic_trace(gpt)
    propagate(gm, tokens)
    print("GPT-2-style transformer (symbolic_trace), tokens int64", tuple(tokens.shape), "on cpu\n")
    print(format_table(NODE_HEADER, node_rows(gm)))
    cnn, (image,) = examples.cnn_example(channels_last=True)
    gm = torch.fx.symbolic_trace(cnn)
    propagate(gm, image)
    print("\nResNet-style CNN (symbolic_trace), channels_last image", tuple(image.shape), "\n")
    print(format_table(NODE_HEADER, node_rows(gm)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fxprop", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="propagate the built-in transformer and CNN and print every node")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    return 2


if __name__ == "__main__":
    sys.exit(main())
