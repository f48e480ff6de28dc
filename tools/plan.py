"""Plan GPU count, grid, algorithm and batch from a cluster profile (same as nnabla-torus-plan).

    python tools/plan.py --profile abci --schedule 0:34816,5:69632 --local-batch 32 --explain
"""
import sys

from nnabla_torus.plan_cli import main

if __name__ == "__main__":
    sys.exit(main())
