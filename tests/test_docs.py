"""The documentation site builds strictly, and the examples in the docstrings it renders run.

The ```python blocks of README.md and docs/ run as tests of their own (Sybil, see the root
conftest.py)."""
import doctest
import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "reference" / "api.md"


def test_site_builds_strictly(tmp_path):
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "reference" / "api" / "index.html").read_text().count('class="doc doc-heading"') > 0


def _documented_modules() -> list[str]:
    """The modules of every object the API reference renders."""
    modules = set()
    for path in re.findall(r"^::: ([\w.]+)$", API_PAGE.read_text(), flags=re.M):
        parent, name = path.rsplit(".", 1)
        modules.add(getattr(importlib.import_module(parent), name).__module__)
    return sorted(modules)


@pytest.mark.parametrize("module", _documented_modules())
def test_docstring_examples_run(module):
    found = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert found.failed == 0
