import os
import sys
import tempfile

# Make the repository importable (examples/, tools/) the same way under pytest and mpirun; and
# tools/, tools/research/ and examples/imagenet/ themselves, whose scripts import their siblings
# by bare name (as when run as scripts; research and the example last, so that their module
# names shadow nothing).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, REPO)
sys.path.append(os.path.join(REPO, "tools", "research"))
sys.path.append(os.path.join(REPO, "examples", "imagenet"))
# auto's table cache for jobs launched without tests/mpirun.py (the elastic launcher's): a
# folder of this test session, never the user's ~/.cache (run_mpi gives each job a fresh one)
_AUTO_CACHE = tempfile.TemporaryDirectory(prefix="nnabla_torus_cache_")
os.environ.setdefault("NNABLA_TORUS_CACHE_DIR", _AUTO_CACHE.name)
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
