"""Make the ImageNet example's modules (examples/imagenet: models, data, ...) importable.

The tools import nnabla_torus as the installed (editable) package; the example, though, is a
folder of scripts whose modules import each other by bare name (``from models import
get_model``), so its folder goes on sys.path: here, once, for every tool that needs it.
"""
import os
import sys

EXAMPLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "examples", "imagenet")
if EXAMPLE_DIR not in sys.path:
    sys.path.insert(0, EXAMPLE_DIR)
