import os
import sys

# Make the repository importable (examples/, tools/) the same way under pytest and mpirun; and
# tools/ itself, whose scripts import their siblings by bare name (as when run as scripts).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
sys.path.insert(0, REPO)
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
