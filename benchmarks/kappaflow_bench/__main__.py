"""``python -m kappaflow_bench`` runs the benchmarks' command line."""

import sys

from kappaflow_bench.cli import main

sys.exit(main())
