# Two commands set up a fresh machine and use it:
#   make demo   create .venv (Python 3.10), install, train on the embedded digits data (4 ranks)
#   make test   same set-up, then the whole test suite (MPI tests run under mpirun)
# and, on a machine with 2 or more GPUs (without GPUs: a dry check, exit 0):
#   make gpu-check  install the [gpu] extra, check CUDA/cuDNN/NCCL/MPI, run the NCCL tests,
#                   allreduce_bench and a ResNet-50 train_bench; writes gpu_check.json
VENV ?= .venv
NP ?= 4
PYTEST_ARGS ?=
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Root may run Open MPI only when it says so; 2-core machines need --oversubscribe for NP > 2.
# No --mca mpi_ft_enable 1 (nnabla_torus.launching.mpirun_cmd.FAULT_ARGS) here: it lets survivors name a dead
# rank only across hosts (on one host mpirun names it), and with it Open MPI prints a warning
# for every shared-memory window (ompi/mca/osc/base/osc_base_init.c).
MPIRUN_FLAGS := --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

.PHONY: venv demo test bench gpu-check
venv:
	@bash tools/setup_venv.sh $(VENV)

demo: venv
	mpirun $(MPIRUN_FLAGS) -np $(NP) $(VENV)/bin/python examples/imagenet/train.py

test: venv
	$(VENV)/bin/python -m pytest tests $(PYTEST_ARGS)

bench: venv
	mpirun $(MPIRUN_FLAGS) -np $(NP) $(VENV)/bin/python tools/allreduce_bench.py

gpu-check: venv
	$(VENV)/bin/python tools/gpu_check.py --json gpu_check.json
