"""The DS_* on/off switches: one reading (``durable_spaces/switches.py``)."""

from __future__ import annotations

import pytest

from durable_spaces.errors import ConfigError
from durable_spaces.switches import NAMES, check_all, switch


def test_a_switch_reads_0_1_and_its_default() -> None:
    assert switch("X", {}) is True
    assert switch("X", {}, default=False) is False
    assert switch("X", {"X": "0"}) is False
    assert switch("X", {"X": " 1 "}) is True
    assert switch("X", {"X": "1"}, default=False) is True


@pytest.mark.parametrize("value", ["off", "no", "false", "", " ", "01", "1.0", "on"])
def test_anything_else_is_an_error_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^X="):
        switch("X", {"X": value})


def test_check_all_names_the_bad_one() -> None:
    env = dict.fromkeys(NAMES, "1")
    check_all(env)
    env[NAMES[-1]] = "yes"
    with pytest.raises(ConfigError, match=NAMES[-1]):
        check_all(env)
