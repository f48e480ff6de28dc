"""Simulation: virtual ranks, the flow engine and the SimGrid engine."""
