"""Reading train.py's output in tests."""
import json


def summary_of(out):
    """train.py's JSON summary: the last line of ``out`` that starts with '{"val_top1"'."""
    return json.loads([line for line in out.splitlines() if line.startswith('{"val_top1"')][-1])
