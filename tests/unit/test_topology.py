"""Topology: grid rows and columns, grid parsing, the default grid, grid checks, host layout."""
import pytest

from nnabla_torus.comm.topology import (Grid, HostLayout, check_grid, default_grid, factor_pairs,
                                   parse_grid, squarest_grid)


def test_rows_are_consecutive_ranks_and_columns_stride_by_x():
    g = Grid(4, 2)
    assert g.size == 8 and str(g) == "4x2"
    assert [g.row_of(r) for r in (0, 3, 4, 7)] == [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2
    assert [g.column_of(r) for r in (0, 1, 5, 7)] == [[0, 4], [1, 5], [1, 5], [3, 7]]


@pytest.mark.parametrize("x, y", [(1, 1), (1, 6), (6, 1), (2, 3), (3, 2), (2, 4), (4, 2)])
def test_rows_and_columns_partition_the_world(x, y):
    g = Grid(x, y)
    for rank in range(g.size):
        row, column = g.row_of(rank), g.column_of(rank)
        assert len(row) == x and len(column) == y
        assert set(row) & set(column) == {rank}          # a row and a column meet in one rank
        assert all(g.row_of(r) == row for r in row)       # every member sees the same row
        assert all(g.column_of(r) == column for r in column)
    rows = [g.row_of(start) for start in range(0, g.size, x)]
    assert sorted(r for row in rows for r in row) == list(range(g.size))


@pytest.mark.parametrize("text, grid", [("2x4", Grid(2, 4)), ("4X2", Grid(4, 2)),
                                        ("1x8", Grid(1, 8)), ("3*2", Grid(3, 2)),
                                        (" 2 x 3 ", Grid(2, 3))])
def test_parse_grid(text, grid):
    assert parse_grid(text) == grid


@pytest.mark.parametrize("bad", ["", "2", "2x", "x2", "0x4", "2x0", "-2x2", "2x2x2", "2.5x2",
                                 "axb", "2by2"])
def test_parse_grid_rejects_with_the_expected_form(bad):
    with pytest.raises(ValueError, match=r"not of the form XxY.*e\.g\. 2x4"):
        parse_grid(bad)


def test_factor_pairs_and_squarest():
    assert factor_pairs(8) == [Grid(8, 1), Grid(4, 2), Grid(2, 4), Grid(1, 8)]
    assert factor_pairs(1) == [Grid(1, 1)]
    assert [squarest_grid(n) for n in (1, 2, 4, 6, 8, 9, 12, 7)] == [
        Grid(1, 1), Grid(2, 1), Grid(2, 2), Grid(3, 2), Grid(4, 2), Grid(3, 3), Grid(4, 3),
        Grid(7, 1)]


@pytest.mark.parametrize("size, per_host, grid", [
    (8, 4, Grid(4, 2)), (8, 2, Grid(2, 4)), (16, 4, Grid(4, 4)), (2176, 4, Grid(4, 544)),
    (12, 3, Grid(3, 4)),
    (8, 8, Grid(4, 2)),    # one host: no host split, squarest
    (8, 3, Grid(4, 2)),    # 3 does not divide 8: squarest
    (8, 0, Grid(4, 2)),    # unequal hosts: squarest
    (6, 1, Grid(3, 2)),    # one rank per host: squarest
    (1, 1, Grid(1, 1)), (4, 1, Grid(2, 2)),
])
def test_default_grid_prefers_ranks_per_host_then_squarest(size, per_host, grid):
    assert default_grid(size, per_host) == (grid, None)


@pytest.mark.parametrize("size", [2, 3, 5, 7, 11, 13])
def test_default_grid_of_a_prime_world_is_a_ring_with_a_note(size):
    grid, note = default_grid(size, size)
    assert grid == Grid(size, 1)
    assert f"world size {size} is prime" in note and f"ring ({size}x1)" in note


def test_check_grid_names_the_grids_that_fit():
    check_grid(Grid(2, 2), 4)
    with pytest.raises(ValueError) as e:
        check_grid(Grid(3, 3), 4)
    msg = str(e.value)
    assert "grid 3x3 has 9 ranks but the world has 4" in msg
    assert "one of 4x1, 2x2, 1x4" in msg and "NNABLA_TORUS_GRID" in msg


def test_host_layout_groups_ranks_by_name_in_first_seen_order():
    layout = HostLayout.from_names(["b", "b", "a", "a", "b", "c"])
    assert layout.hosts == [[0, 1, 4], [2, 3], [5]]
    assert layout.host_of(4) == [0, 1, 4]
    assert layout.local_rank(4) == 2 and layout.local_rank(3) == 1
    assert layout.ranks_per_host == 0               # unequal hosts
    assert not layout.is_blocked()                  # host b is not a block of consecutive ranks


def test_host_layout_of_equal_blocked_hosts():
    layout = HostLayout.from_names([f"node{r // 4}" for r in range(8)])
    assert layout.hosts == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.ranks_per_host == 4 and layout.is_blocked()
    assert [layout.local_rank(r) for r in range(8)] == [0, 1, 2, 3] * 2
    assert HostLayout.from_names(["x"]).ranks_per_host == 1
