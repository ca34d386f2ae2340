"""python -m nanospa.bench: the benchmark's command (nanospa/bench/command.py)."""
import sys

from .command import main

sys.exit(main())
