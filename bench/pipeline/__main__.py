"""`python -m bench.pipeline`: one scenario run, ending with its summary table (`--help` for which)."""

import sys

from bench._support import run_on_fastest_loop
from bench.pipeline.scenarios import main, parse_args

sys.exit(run_on_fastest_loop(main(parse_args())))
