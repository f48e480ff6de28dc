"""Make tools/ importable from tools/research: its helper ``_example`` and the user tools a
research script builds on (``emucluster_model_check``), imported by bare name as in tools/.

Run as ``python tools/research/X.py``, a script sees only its own folder on sys.path; this puts
the parent folder there too, once, for every research script that needs it.
"""
import os
import sys

TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TOOLS_DIR not in sys.path:
    sys.path.insert(0, TOOLS_DIR)
