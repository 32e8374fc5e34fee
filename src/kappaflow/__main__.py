"""``python -m kappaflow`` runs the CLI."""

import sys

from kappaflow.cli import main

sys.exit(main())
