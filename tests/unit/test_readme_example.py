"""The README's example runs as written (on the local backend, in a temp dir), so the
public API it shows cannot drift from the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_adapter_example_in_the_readme_runs(tmp_path: Path) -> None:
    text = README.read_text()
    m = re.search(r"## The adapter in code\n\n```python\n(.*?)```", text, re.S)
    assert m is not None, "the README lost its adapter example"
    code = m.group(1)
    assert "from durable_spaces." not in code.replace("from durable_spaces.testing", ""), (
        "the example must import only the public API (and the testing helpers)"
    )
    code = (
        code.replace('"spacesd"', '"local"')
        .replace("/var/lib/my-agent", str(tmp_path))
        .replace("/srv/ckpt", str(tmp_path / "ckpt"))
    )
    script = tmp_path / "example.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "status='done'" in r.stdout
