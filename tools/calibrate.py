"""Calibrate the cost model on this machine and write a cluster profile.

    python tools/calibrate.py --ranks 2,4,8 --train-ranks 1,2,4 --batches 4,8,16,32 \\
        --out nnabla_torus/planning/profiles/cpu-2core.yaml

Run it alone (under ``flock /tmp/nnabla-torus-bench.lock`` on a shared machine): it times.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nnabla_torus.planning.calibrate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
