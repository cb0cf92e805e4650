"""``bench.mechanisms``: the A/B of each speed mechanism (``docs/mechanisms.md``).

Its saving is each repetition's own (the two sides ran back to back), so a change of the
machine's load between repetitions does not decide it; a real A/B on the local backend
prints its line; a name it does not know is refused in one line before anything runs;
a switch set for one side is put back after it."""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from bench import mechanisms


def test_the_saving_is_the_median_of_each_repetition_s_own() -> None:
    # Load rose under the last two repetitions' "on" sides: the sides' medians would
    # read a loss (10 ms on against 5 off), each repetition's own reads 50, 9.1, -100 %.
    out = mechanisms.line("m", "a call", [0.001, 0.010, 0.010], [0.002, 0.011, 0.005], 1000)
    assert "on_ms=10.00 off_ms=5.00" in out
    assert "saving_pct=9.1 " in out


def test_a_switch_is_set_for_its_side_and_put_back() -> None:
    name = "DS_BENCH_MECHANISMS_TEST"
    os.environ.pop(name, None)
    with mechanisms.env(name, False):
        assert os.environ[name] == "0"
    assert name not in os.environ
    os.environ[name] = "1"
    try:
        with mechanisms.env(name, False):
            assert os.environ[name] == "0"
        assert os.environ[name] == "1"
    finally:
        os.environ.pop(name)


def test_a_real_call_ab_prints_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    before = os.environ.get("DS_SPACE_JOURNAL")
    code = asyncio.run(mechanisms.main(["--only", "host-journal-scan", "--reps", "2"]))
    assert code == 0
    out = capsys.readouterr().out
    assert re.search(r"^MECH name=host-journal-scan .* saving_pct=-?[0-9.]+ n=2$", out, re.M), out
    assert os.environ.get("DS_SPACE_JOURNAL") == before  # the toggles put it back


def test_an_unknown_mechanism_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        asyncio.run(mechanisms.main(["--only", "no-such-thing"]))
    assert e.value.code == 2
    assert "no mechanism no-such-thing" in capsys.readouterr().err


def test_the_witness_and_look_toggles_switch_their_side_and_put_it_back() -> None:
    from durable_spaces.adapter import log_witness
    from durable_spaces.backends.spacesd.namespaced_space import NamespacedSpace

    abs_ = {ab.name: ab for ab in mechanisms.CALLS}
    assert abs_["ledger-marks"].tool == "write"  # the call the marks serve
    with abs_["ledger-marks"].toggle(False):
        assert log_witness.use_marks is False
    assert log_witness.use_marks is True
    method = NamespacedSpace.host_processes
    with abs_["host-look-spacesd"].toggle(False):
        assert NamespacedSpace.host_processes(object()) is None  # type: ignore[arg-type]
    assert NamespacedSpace.host_processes is method
