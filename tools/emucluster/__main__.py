"""Entry point: ``python -m tools.emucluster SUBCOMMAND ...`` (see ``cli``)."""
import sys

from .cli import main

sys.exit(main())
