"""The microvm backend's ``DS_MICROVM_*`` settings, read strictly where the backend is
made (``durable_spaces/settings.py``): it used to take any value but ``0`` as on, so
``DS_MICROVM_COMPRESS=no`` left compression on. No guest is started here."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_spaces.backends.microvm.backend import MicrovmBackend, unavailable_reason
from durable_spaces.errors import BackendUnavailableError, ConfigError
from durable_spaces.settings import Settings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DS_MICROVM_COMPRESS", "no"),
        ("DS_MICROVM_SWEEP_ORPHANS", "yes"),
        ("DS_MICROVM_KEEP_CHECKPOINTS", "-1"),
        ("DS_MICROVM_ACCEL", "hvf"),
        ("DS_MICROVM_BOOT_TIMEOUT", "never"),
    ],
)
def test_a_malformed_variable_fails_the_backend_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"^{name}="):
        MicrovmBackend(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_given_settings_are_taken_and_the_environment_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DS_MICROVM_COMPRESS", "no")  # not read: settings are given
    settings = Settings(microvm_compress=False, microvm_keep_checkpoints=2)
    if (why := unavailable_reason(settings=settings)) is not None:
        with pytest.raises(BackendUnavailableError):
            MicrovmBackend(tmp_path, settings=settings)
        pytest.skip(f"the rest needs a built image: {why}")
    b = MicrovmBackend(tmp_path, settings=settings)
    assert (b.compress, b.keep_checkpoints, b.sweep_orphans) == (False, 2, False)
    assert MicrovmBackend(tmp_path, compress=True, settings=settings).compress is True
