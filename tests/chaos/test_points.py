"""The failpoint registry is the one list: every ``hit()`` in ``durable_spaces/`` names a
registered point, every registered point is hit somewhere, and the lists the lab draws
from (kill points, pause points, every-call points) are made of registered names."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import durable_spaces
from durable_spaces.chaos import faults, points, schedule

PACKAGE = Path(durable_spaces.__file__).parent


def _names(arg: ast.expr, where: str) -> Iterator[str]:
    """The point name(s) a ``hit()`` argument can be: a literal, ``points.X``, or a
    conditional between those; anything else is refused (the name must be checkable)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        yield arg.value
    elif isinstance(arg, ast.IfExp):
        yield from _names(arg.body, where)
        yield from _names(arg.orelse, where)
    elif (
        isinstance(arg, ast.Attribute)
        and isinstance(arg.value, ast.Name)
        and arg.value.id == "points"
    ):
        yield getattr(points, arg.attr)
    else:
        raise AssertionError(f"{where}: hit() takes a literal or a points constant, not "
                             f"{ast.unparse(arg)!r}")  # fmt: skip


def hits(source: str, where: str) -> Iterator[tuple[str, bool, str]]:
    """``(point, timer, "file:line")`` for every ``hit(...)``/``failpoints.hit(...)``."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        if (isinstance(f, ast.Name) and f.id == "hit") or (
            isinstance(f, ast.Attribute) and f.attr == "hit"
        ):
            timer = any(
                k.arg == "timer" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords
            )
            at = f"{where}:{node.lineno}"
            for name in _names(node.args[0], at):
                yield name, timer, at


def product_hits() -> list[tuple[str, bool, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "failpoints.py" and path.parent.name == "chaos":
            continue  # the mechanism itself
        out += hits(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    return out


def test_every_hit_in_the_package_names_a_registered_point() -> None:
    found = product_hits()
    assert len(found) > 40  # the scan sees the product's hits
    bad = [f"{at}: {name}" for name, _, at in found if not points.known(name)]
    assert not bad, "unregistered failpoints (add them to chaos/points.py):\n" + "\n".join(bad)


def test_the_scan_catches_an_unregistered_literal_and_an_unreadable_name() -> None:
    src = 'hit("adapter.call")\nfailpoints.hit("adapter.cal")\n'
    assert [n for n, _, _ in hits(src, "x.py") if not points.known(n)] == ["adapter.cal"]
    with pytest.raises(AssertionError, match="literal or a points constant"):
        list(hits("hit(name)\n", "x.py"))


def test_every_registered_point_is_hit_and_timer_points_only_from_timers() -> None:
    seen: dict[str, set[bool]] = {}
    for name, timer, _ in product_hits():
        seen.setdefault(name, set()).add(timer)
    assert set(points.REGISTRY) - set(seen) == set(), "registered but never hit"
    for name, p in points.REGISTRY.items():
        assert p.timer == (seen[name] == {True}), name
        assert p.also_timer == (seen[name] == {True, False}), f"{name}: hit both ways"
        assert p.group in points.GROUPS and p.meaning, name


def test_the_lab_draws_only_registered_points() -> None:
    assert points.unknown(faults.PAUSE_POINTS) == []
    assert points.unknown(schedule.EVERY_CALL) == []
    assert schedule.TIMER_DRIVEN == points.TIMER_ONLY
    assert points.TIMER_ONLY < points.TIMED and points.ADAPTER_MID_CALL in points.TIMED
    with pytest.raises(ValueError, match=r"adapter\.nope"):
        points.check(("adapter.call", "adapter.nope"), "a hand list")
