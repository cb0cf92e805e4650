"""The product's DS_* settings (``durable_spaces/settings.py``) and the lab's
(``campaigns/spec.py``'s ``LabSettings``): one strict reading, one frozen value."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from durable_spaces.campaigns.spec import (
    BEHAVIOUR_ENV,
    LabSettings,
    behaviour_env,
    check_env,
    recorded_env,
)
from durable_spaces.errors import ConfigError
from durable_spaces.settings import Settings, parse_switch

SWITCHES = [
    f.metadata["env"]
    for cls in (Settings, LabSettings)
    for f in fields(cls)
    if f.metadata["parse"] is parse_switch
]


def test_unset_is_the_default_and_the_value_is_frozen() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    with pytest.raises(AttributeError):
        s.space_journal = False  # type: ignore[misc]


def test_a_switch_reads_0_and_1() -> None:
    assert Settings.from_env({"DS_SPACE_JOURNAL": "0"}).space_journal is False
    assert Settings.from_env({"DS_SPACE_JOURNAL": " 1 "}).space_journal is True
    assert Settings.from_env({"DS_MICROVM_SWEEP_ORPHANS": "1"}).microvm_sweep_orphans is True
    assert LabSettings.from_env({"DS_FAST_EXIT": "0"}).fast_exit is False


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize("value", ["off", "no", "false", "", " ", "01", "1.0", "on", "yes"])
def test_anything_else_is_an_error_naming_the_variable(name: str, value: str) -> None:
    """``DS_MICROVM_COMPRESS=no`` used to leave compression on (anything but ``0`` was on)."""
    cls = Settings if name in Settings.names() else LabSettings
    with pytest.raises(ConfigError, match=rf"^{name}="):
        cls.from_env({name: value})


BAD = {
    "DS_LOCAL_FORKSERVER_IDLE": ["soon", "nan", "-1", "inf", "0", "86401"],
    "DS_MICROVM_BOOT_TIMEOUT": ["nan", "0", "2m"],
    "DS_MICROVM_KEEP_CHECKPOINTS": ["-1", "1.5", "x", "\uff15"],
    "DS_MICROVM_MEMORY_MB": ["0", "63", "lots"],
    "DS_MICROVM_ACCEL": ["hvf", "KVM"],
    "DS_LOG_FORMAT": ["xml", "SQLITE"],
    "DS_LOG_SYNCHRONOUS": ["EXTRA", "2"],
    "DS_DEBIAN_MIRROR": ["ftp://x", "deb.debian.org", "http://a b"],
    "DS_HOST_BOOT_ID": ["a\0b"],
    "DS_MUTANTS": ["nope", "rerun_exited,nope"],
}


@pytest.mark.parametrize(
    ("name", "value"), [(n, v) for n, vs in BAD.items() for v in vs], ids=lambda x: repr(x)
)
def test_numbers_choices_and_paths_are_checked(name: str, value: str) -> None:
    cls = Settings if name in Settings.names() else LabSettings
    with pytest.raises(ConfigError, match=name) as e:
        cls.from_env({name: value})
    assert "\n" not in str(e.value)


def test_good_values_are_read_as_their_type(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "DS_LOCAL_FORKSERVER_IDLE": "0.5",
            "DS_MICROVM_KEEP_CHECKPOINTS": "3",
            "DS_MICROVM_ACCEL": "tcg",
            "DS_LOG_FORMAT": "jsonl",
            "DS_LOG_SYNCHRONOUS": "off",
            "DS_HOST_BOOT_ID": str(tmp_path / "boot"),
            "DS_PG_BINDIR": "",  # empty: unset, for a setting without a default
        }
    )
    assert s.local_forkserver_idle == 0.5 and s.microvm_keep_checkpoints == 3
    assert (s.microvm_accel, s.log_format, s.log_synchronous) == ("tcg", "jsonl", "OFF")
    assert s.host_boot_id == tmp_path / "boot" and s.pg_bindir is None


def test_off_is_for_a_jsonl_log_only() -> None:
    with pytest.raises(ConfigError, match="DS_LOG_SYNCHRONOUS=OFF is for a JSONL log"):
        Settings.from_env({"DS_LOG_SYNCHRONOUS": "OFF"})


def test_to_env_gives_back_what_from_env_reads() -> None:
    s = Settings(space_journal=False, microvm_keep_checkpoints=2, log_format="jsonl")
    assert Settings.from_env(s.to_env()) == s
    lab = LabSettings(zygote=False, mutants="rerun_exited")
    assert LabSettings.from_env(lab.to_env()) == lab


def test_a_record_carries_the_whole_configuration() -> None:
    """Every recorded variable with its value, defaults included; a replay reads it back
    to the same settings, and a repro line names those not at their default."""
    env = {"DS_HOST_SCAN": "0", "DS_ZYGOTE": "0", "DS_MICROVM_COMPRESS": "0"}
    whole = recorded_env(env)
    assert set(whole) >= set(BEHAVIOUR_ENV) - {"DS_MICROVM_ACCEL", "DS_MUTANTS"}
    assert whole["DS_SPACE_JOURNAL"] == "1" and whole["DS_HOST_SCAN"] == "0"
    assert check_env(whole, "r") == whole
    assert Settings.from_env(whole) == Settings.from_env(env)
    assert LabSettings.from_env(whole) == LabSettings.from_env(env)
    assert behaviour_env(env) == env
    # the machine's own places are not recorded (another machine has its own)
    assert "DS_CACHE_DIR" not in BEHAVIOUR_ENV and "DS_ZYGOTE_SOCKET" not in BEHAVIOUR_ENV


def test_a_record_with_a_bad_value_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^run r: DS_MICROVM_COMPRESS='no'"):
        check_env({"DS_MICROVM_COMPRESS": "no"}, "run r")


def test_every_command_refuses_a_malformed_setting_first(tmp_path: Path) -> None:
    """Not only the switches: a number, a choice or a path, in one line, exit 1."""
    for name, value in (("DS_MICROVM_BOOT_TIMEOUT", "nan"), ("DS_LOG_FORMAT", "xml")):
        p = subprocess.run(
            [sys.executable, "-m", "durable_spaces.cli", "report", str(tmp_path)],
            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", name: value,
                                                 **_pythonpath()},
        )  # fmt: skip
        assert p.returncode == 1 and p.stderr.startswith(f"durable-spaces: error: {name}=")
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def _pythonpath() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "HOME")}


def test_docs_list_every_variable() -> None:
    """``docs/configuration.md`` names every setting, the product's and the lab's."""
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    missing = [n for n in (*Settings.names(), *LabSettings.names()) if f"`{n}`" not in doc]
    assert not missing, f"docs/configuration.md does not list {missing}"
