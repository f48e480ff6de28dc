"""Test doubles shipped for the test suite and gpu-check (not used by training)."""
