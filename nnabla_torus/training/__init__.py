"""The public API for a user's own nnabla training loop (docs/own-script.md).

``State`` (checkpoint and restart under nnabla-torus-run) and ``AdaptiveBatch`` (the batch
size from the state of learning) are what examples/imagenet/train.py uses too.
"""
from .adaptive import AdaptiveBatch  # noqa: F401
from .checkpoint_file import CheckpointError  # noqa: F401
from .run_lock import RunFolderBusy  # noqa: F401
from .state import State  # noqa: F401
from ..launching.elastic_protocol import EXIT_STOPPED  # noqa: F401  (State.stop_requested)
