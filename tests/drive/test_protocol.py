"""The driver <-> coordinator contract is defined once: what a coordinator writes, the
driver reads back; what a driver prints, a coordinator parses (even glued lines)."""

from __future__ import annotations

from pathlib import Path

from durable_spaces.drive import protocol as sp
from durable_spaces.drive.entry import Session


def test_the_environment_a_coordinator_builds_is_what_a_driver_reads(tmp_path: Path) -> None:
    env = sp.driver_environment("sess-1", 7, tmp_path, 2.5, space="ds-abc")
    s = Session.from_env(env)
    assert (s.name, s.epoch, s.state_dir, s.heartbeat_secs, s.space) == (
        "sess-1",
        7,
        tmp_path,
        2.5,
        "ds-abc",
    )
    assert sp.SPACE not in sp.driver_environment("s", 1, tmp_path, 1.0)


def test_heartbeats_and_events_are_read_back_even_glued_together() -> None:
    beat = sp.heartbeat_line(3, unix_ms=1000)
    event = sp.event_line("first_step", epoch=3, tool="bash")
    assert list(sp.read_line(beat.strip())) == [("heartbeat", None)]
    glued = beat.strip() + event.strip() + " trailing junk"
    kinds = list(sp.read_line(glued))
    assert [k for k, _ in kinds] == ["heartbeat", "event"]
    data = kinds[1][1]
    assert data is not None and data["event"] == "first_step" and data["tool"] == "bash"
    assert list(sp.read_line("DS-EVENT {not json")) == []
    assert list(sp.read_line("DS-EVENT [1, 2]")) == []  # an event is an object
    assert (sp.EXIT_DONE, sp.EXIT_FENCED, sp.EXIT_PERMANENT) == (0, 75, 78)
