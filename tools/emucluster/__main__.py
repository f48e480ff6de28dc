"""Entry point: ``python -m tools.emucluster SUBCOMMAND ...`` (see ``cli``)."""
import sys

from tools.emucluster.cli import main

sys.exit(main())
