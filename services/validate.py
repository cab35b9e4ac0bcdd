"""`python -m relay_rl.services.validate CONFIG [--set ...]`: same as `relay validate`."""

import sys

from ..services.cli import main

if __name__ == "__main__":
    sys.exit(main(["validate", *sys.argv[1:]]))
