"""powerfs's pure parts, without a mount: the dirty-range bookkeeping and the tear draw."""

from __future__ import annotations

import random

from durable_spaces.chaos.powerfs.cut import SECTOR, boundary
from durable_spaces.chaos.powerfs.volatile import Pending, Volatile


def test_ranges_merge_touching_and_overlapping_writes() -> None:
    p = Pending()
    for start, end in [(10, 20), (30, 40), (20, 25), (5, 8), (35, 50), (0, 1)]:
        p.add_range(start, end)
    assert p.ranges() == [(0, 1), (5, 8), (10, 25), (30, 50)]
    p.add_range(1, 30)
    assert p.ranges() == [(0, 50)] and p.dirty_bytes == 50


def test_ranges_match_a_brute_force_model() -> None:
    rng = random.Random(1)
    for _ in range(200):
        p, covered = Pending(), set()
        for _ in range(rng.randrange(1, 12)):
            s = rng.randrange(100)
            e = s + rng.randrange(1, 20)
            p.add_range(s, e)
            covered |= set(range(s, e))
        assert {i for s, e in p.ranges() for i in range(s, e)} == covered
        starts = [s for s, _ in p.ranges()]
        ends = [e for _, e in p.ranges()]
        assert all(e < s for e, s in zip(ends, starts[1:], strict=False))  # disjoint, apart


def test_a_sync_clears_data_and_keeps_what_it_does_not_cover() -> None:
    v = Volatile()
    v.wrote(7, 0, b"abc")
    v.truncated(7, 1)
    v.meta(7)
    v.dir_changed(9)
    assert v.totals() == {"pending_ops": 4, "pending_bytes": 3, "pending_inodes": 2}
    assert v.get(7).last_write is None  # a truncate after the write: nothing to tear
    v.synced_data(7, with_meta=False)  # fdatasync: mode changes stay volatile
    assert (v.get(7).meta_ops, v.get(7).ranges(), v.get(7).floor) == (1, [], None)
    v.synced_data(7, with_meta=True)
    v.synced_dir(9, with_meta=False)
    assert v.totals()["pending_inodes"] == 0


def test_tear_boundaries_are_sectors_inside_the_write_and_seeded() -> None:
    for offset, length in [(0, 5000), (1000, 3000), (512, 512), (100, 10), (0, 1)]:
        seen = {boundary(s, 1, "f", offset, length) for s in range(300)}
        inside = {b for b in range(offset + 1, offset + length) if b % SECTOR == 0}
        assert seen == inside | {offset}  # every choice is drawn, nothing else
    assert boundary("x", 2, "a/b", 0, 9000) == boundary("x", 2, "a/b", 0, 9000)
    assert len({boundary("x", c, "a/b", 0, 9000) for c in range(30)}) > 3  # per cut
