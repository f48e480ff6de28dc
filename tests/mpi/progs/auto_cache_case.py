"""One init() with the default algorithm (auto); each rank prints its table and init's time."""
import time

import nnabla_torus as C

start = time.perf_counter()
comm = C.MultiProcessDataParallelCommunicator()
comm.init()
took = time.perf_counter() - start
print(f"rank {comm.rank} algorithm {comm.algorithm} table {comm.auto_table.describe()!r} "
      f"source {comm.auto_table.source!r} init {took * 1e3:.1f} ms", flush=True)
