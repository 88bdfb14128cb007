"""``python -m specdec_np``: the same command line as ``specdec-np``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m specdec_np"))
