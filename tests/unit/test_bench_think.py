"""``bench.adapter --think``: the pause after each call is a number of milliseconds the
bench can sleep; NaN, negative or infinite values (an infinite one would never wake)
are refused in one line before anything starts."""

from __future__ import annotations

import asyncio

import pytest

from bench import adapter


@pytest.mark.parametrize("bad", ["-5", "nan", "inf", "70000"])
def test_a_think_time_it_cannot_sleep_is_refused(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        asyncio.run(adapter.main(["--backends", "local", "--think", bad]))
    assert e.value.code == 2
    assert f"--think {bad}" in capsys.readouterr().err
