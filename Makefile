# Two commands set up a fresh machine and use it:
#   make demo   create .venv (Python 3.10), install, train on the embedded digits data (4 ranks)
#   make test   same set-up, then the whole test suite (MPI tests run under mpirun)
VENV ?= .venv
NP ?= 4
PYTEST_ARGS ?=
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Root may run Open MPI only when it says so; 2-core machines need --oversubscribe for NP > 2;
# mpi_ft_enable lets the survivors of a dead rank name it (nnabla_torus.launch.FAULT_ARGS).
MPIRUN_FLAGS := --oversubscribe --mca mpi_ft_enable 1 $(if $(filter 0,$(shell id -u)),--allow-run-as-root)

.PHONY: venv demo test bench
venv:
	@bash tools/setup_venv.sh $(VENV)

demo: venv
	mpirun $(MPIRUN_FLAGS) -np $(NP) $(VENV)/bin/python examples/imagenet/train.py

test: venv
	$(VENV)/bin/python -m pytest tests $(PYTEST_ARGS)

bench: venv
	mpirun $(MPIRUN_FLAGS) -np $(NP) $(VENV)/bin/python tools/allreduce_bench.py
