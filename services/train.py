"""`python -m services.train CONFIG [...]`: the same as `relay train` (what `ray job submit` runs)."""

import sys

from services.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
