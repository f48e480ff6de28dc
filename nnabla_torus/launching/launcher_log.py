"""nnabla-torus-run's own lines: each with the seconds since the launcher started."""
import time

STARTED = time.monotonic()


def log(text):
    """One launcher line, with the seconds since the launcher started."""
    print(f"nnabla-torus-run [{time.monotonic() - STARTED:.1f} s]: {text}", flush=True)
