"""Launching: the mpirun command line and the elastic launcher."""
