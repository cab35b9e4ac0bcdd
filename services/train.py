"""`python -m relay_rl.services.train CONFIG [...]`: the same as `relay train` (`ray job submit` runs it)."""

import sys

from ..services.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
