"""The public API: every name in ``durable_spaces.__all__`` resolves, lazily."""

from __future__ import annotations

import subprocess
import sys

import durable_spaces


def test_every_public_name_resolves_to_the_object_its_module_defines() -> None:
    for name in durable_spaces.__all__:
        obj = getattr(durable_spaces, name)
        assert obj is not None, name
    assert 20 <= len(durable_spaces.__all__) <= 45


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        durable_spaces.no_such_thing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("an unknown public name resolved")


def test_importing_the_package_imports_no_backend_sdk_or_report_library() -> None:
    """A driver's start is on every resume path: the package itself imports nothing."""
    code = (
        "import sys, durable_spaces; "
        "print(','.join(m for m in ('cua', 'pandas', 'matplotlib', 'docker', 'psycopg') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout
