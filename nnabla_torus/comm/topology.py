"""Topology: which ranks form the rows and columns of the all-reduce grid.

A grid ``XxY`` has Y rows of X ranks each. In the 2D-torus all-reduce a rank reduce-scatters
along its row (X members), all-reduces its 1/X shard along its column (Y members), then
all-gathers along its row. Rows of a ``Grid`` are consecutive ranks, so with X = ranks per host
and ranks placed host by host (mpirun's default ``--map-by slot``) every row stays inside one
host and only the column phase crosses hosts. A 1xN or Nx1 grid is a plain ring.

Example::

    >>> g = Grid(4, 2)          # 8 ranks: rows [0 1 2 3] [4 5 6 7]
    >>> g.row_of(5), g.column_of(5)
    ([4, 5, 6, 7], [1, 5])
"""
from dataclasses import dataclass
from typing import List, Sequence


@dataclass(frozen=True)
class Grid:
    """An X x Y process grid: ``x`` ranks per row, ``y`` rows."""
    x: int
    y: int

    @property
    def size(self):
        return self.x * self.y

    def row_of(self, rank):
        """The ranks of ``rank``'s row, in ring order."""
        start = (rank // self.x) * self.x
        return list(range(start, start + self.x))

    def column_of(self, rank):
        """The ranks of ``rank``'s column, in ring order."""
        return list(range(rank % self.x, self.size, self.x))

    def __str__(self):
        return f"{self.x}x{self.y}"


def parse_grid(text):
    """Parse ``"XxY"`` (e.g. ``"2x4"``) into a Grid; raise ValueError on anything else."""
    parts = str(text).lower().replace("*", "x").split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"grid {text!r} is not of the form XxY with positive integers, e.g. 2x4")
    return Grid(int(parts[0]), int(parts[1]))


def factor_pairs(size):
    """All grids (x, y) with x * y == size, widest rows first."""
    return [Grid(size // y, y) for y in range(1, size + 1) if size % y == 0]


def squarest_grid(size):
    """The most square X x Y factorisation of ``size`` with X >= Y (rows carry more bytes)."""
    y = max(d for d in range(1, int(size ** 0.5) + 1) if size % d == 0)
    return Grid(size // y, y)


def default_grid(size, ranks_per_host):
    """Grid used when the user names none; returns (grid, note or None).

    X = ranks per host when that splits the world into two or more equal hosts, else the
    most square factorisation. A prime world size has no 2D grid: it becomes a ring (Nx1)
    and the note says so.
    """
    if 1 < ranks_per_host < size and size % ranks_per_host == 0:
        return Grid(ranks_per_host, size // ranks_per_host), None
    grid = squarest_grid(size)
    if grid.y == 1 and size > 1:
        return grid, (f"world size {size} is prime: no 2D grid fits, torus2d runs as a ring "
                      f"({grid}); choose a rank count with factors for a 2D torus")
    return grid, None


def check_grid(grid, size):
    """Raise ValueError unless ``grid`` covers exactly ``size`` ranks, naming grids that fit."""
    if grid.size != size:
        fits = ", ".join(str(g) for g in factor_pairs(size))
        raise ValueError(f"grid {grid} has {grid.size} ranks but the world has {size}; "
                         f"use X*Y == {size}: one of {fits} (NNABLA_TORUS_GRID or grid=)")


@dataclass(frozen=True)
class HostLayout:
    """Where ranks live: ``hosts[h]`` lists the ranks on host h, in rank order."""
    hosts: List[List[int]]

    @classmethod
    def from_names(cls, names: Sequence[str]):
        """Group ranks by host name (e.g. ``MPI.Get_processor_name()`` of every rank)."""
        order = []
        groups = {}
        for rank, name in enumerate(names):
            if name not in groups:
                order.append(name)
                groups[name] = []
            groups[name].append(rank)
        return cls([groups[n] for n in order])

    def host_of(self, rank):
        return next(h for h in self.hosts if rank in h)

    def local_rank(self, rank):
        return self.host_of(rank).index(rank)

    @property
    def ranks_per_host(self):
        """Ranks on every host when all hosts hold the same number, else 0."""
        counts = {len(h) for h in self.hosts}
        return counts.pop() if len(counts) == 1 else 0

    def spans_hosts(self, ranks):
        """True when ``ranks`` live on more than one host."""
        home = self.host_of(ranks[0])
        return any(r not in home for r in ranks)

    def is_blocked(self):
        """True when every host holds consecutive ranks (rows of a Grid stay on one host)."""
        return all(h == list(range(h[0], h[0] + len(h))) for h in self.hosts)
