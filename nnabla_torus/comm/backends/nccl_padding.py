"""NCCL's equal chunks: a group of m ranks splits a buffer into m chunks of the same length, so
``reduce_scatter`` and ``all_gather`` of a buffer whose length m does not divide go through a
zero-padded workspace; its chunks are ``[i*c, (i+1)*c)`` cut at n, with c = ceil(n/m)
(docs/gpu.md, "The NCCL mapping").
"""


class PaddedChunks:
    """``reduce_scatter`` and ``all_gather`` of :class:`.nccl.NCCLBackend` on any length, over its
    ``_reduce_scatter_even`` and ``_all_gather_even`` (equal chunks) and its ``_pad`` workspaces.
    """

    def _workspace(self, dtype, count):
        """A reusable zero-padding workspace of at least ``count`` elements."""
        buf = self._pad.get(dtype)
        if buf is None or buf.size < count:
            buf = self._pad[dtype] = self.empty(dtype, count)
        return self.sub(buf, 0, count)

    def reduce_scatter(self, group, buf, what="reduce_scatter"):
        """Sum ``buf`` over ``group``; return our chunk (a view of ``buf``) holding the sum."""
        m, n = group.size, buf.size
        if m == 1 or n == 0:
            return buf
        chunk = -(-n // m)
        lo, hi = min(group.rank * chunk, n), min((group.rank + 1) * chunk, n)
        if n % m == 0:
            self._reduce_scatter_even(group, buf, chunk, what)
            return self.sub(buf, lo, hi)
        work = self._workspace(buf.dtype, chunk * m)
        self.copy(self.sub(work, 0, n), buf)
        self.sub(work, n, chunk * m).fill(0)
        self._reduce_scatter_even(group, work, chunk, what)
        if hi > lo:
            self.copy(self.sub(buf, lo, hi), self.sub(work, lo, hi))
        return self.sub(buf, lo, hi)

    def all_gather(self, group, buf, what="all_gather"):
        """Fill every chunk of ``buf`` with its owner's chunk (owner of chunk i: position i)."""
        m, n = group.size, buf.size
        if m == 1 or n == 0:
            return
        if n % m == 0:
            self._all_gather_even(group, buf, n // m, what)
            return
        chunk = -(-n // m)
        lo, hi = min(group.rank * chunk, n), min((group.rank + 1) * chunk, n)
        work = self._workspace(buf.dtype, chunk * m)
        if hi > lo:
            self.copy(self.sub(work, lo, hi), self.sub(buf, lo, hi))
        self._all_gather_even(group, work, chunk, what)
        self.copy(buf, self.sub(work, 0, n))
