"""``python -m fxprop``: the same command line as the ``fxprop`` console script (see `fxprop.cli`)."""
import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
