import sys

from bench.pipeline.cli import main

sys.exit(main())
