"""The documentation's Python examples run as tests (Sybil): every ```python block of README.md
and of the pages under docs/, in page order with one namespace per page; ``>>>`` lines are
doctests whose printed output is checked."""
import doctest
import os

import torch
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

import fxprop

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _start_page(namespace):
    torch.manual_seed(0)
    namespace["_rules_before"] = set(fxprop.registered_rules())


def _end_page(namespace):
    """A page's rules are its own: what it registered is removed when the page ends."""
    for target in set(fxprop.registered_rules()) - namespace["_rules_before"]:
        fxprop.unregister(target)


pytest_collect_file = Sybil(
    parsers=[PythonCodeBlockParser(doctest_optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE),
             SkipParser()],
    filenames=["README.md"],
    patterns=["docs/*.md", "docs/*/*.md"],
    excludes=["docs/_incoming/*"],
    setup=_start_page,
    teardown=_end_page,
).pytest()
