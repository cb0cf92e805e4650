"""Recipes: loaded and checked before any run; a bad one is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.errors import ConfigError
from durable_spaces.probe.recipe import load, resolve, values
from durable_spaces.probe.task import plan
from tests.probe.helpers import FAKES, write_recipe

GOOD = """name = "x"
launch = ["{python}", "{recipe_dir}/a.py", "{model_url}"]
[tool]
name = "bash"
argument = "command"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "recipe.toml"
    p.write_text(text)
    (tmp_path / "a.py").touch()  # the program GOOD names beside it
    return p


def test_a_recipe_and_its_placeholders(tmp_path: Path) -> None:
    r = load(str(_write(tmp_path, GOOD)))
    assert r.resume == r.launch and r.timeout_s == 60 and r.write_tool is None
    vals = values(r, model_url="http://127.0.0.1:1/v1", workdir=tmp_path, state_dir=tmp_path,
                  run_id="r1", prompt="p")  # fmt: skip
    assert resolve(r.launch[1], vals) == f"{tmp_path}/a.py"
    assert load(str(tmp_path)).name == "x"  # a directory holding one
    assert r.report is None
    said = load(str(_write(tmp_path, GOOD + '[report]\ntext = "[cut off?]"\n'))).report
    assert said is not None and said.search("x [cut off?] y") and not said.search("cut off")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (GOOD.replace('launch = ["{python}", "{recipe_dir}/a.py", "{model_url}"]\n', ""),
         "launch is missing"),
        (GOOD.replace("{model_url}", "{model}"), "unknown placeholder {model}"),
        (GOOD.split("[tool]")[0], "[tool] is missing"),
        ("colour = 1\n" + GOOD, "unknown keys: colour (known:"),
        (GOOD.replace('name = "x"', 'name = "x y"'), "name 'x y'"),
        ("launch = [", ": not TOML"),
        ("timeout_s = -1\n" + GOOD, "timeout_s must be"),
        (GOOD + "shell = 1\n", "[tool] has unknown keys: shell"),
        (GOOD + '[report]\npattern = "x*"\n', "matches an empty text"),
        (GOOD + '[report]\npattern = "(unclosed"\n', "is not a regular expression"),
        (GOOD + '[report]\ntext = "a"\npattern = "b"\n', "[report] takes one key"),
        (GOOD + '[report]\nwords = "a"\n', "[report] takes one key"),
        (GOOD + '[report]\ntext = """two\nlines"""\n', "one line"),
        (GOOD.replace('"{recipe_dir}/a.py"', '"{recipe_dir}/b.py"'), "b.py, which is not there"),
    ],
)  # fmt: skip
def test_a_bad_recipe_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        load(str(_write(tmp_path, text)))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_unreadable_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such recipe file and no built-in recipe"):
        load("no-such-harness")
    with pytest.raises(ConfigError, match="cannot be read"):
        load(str(tmp_path / "missing.toml"))
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match="cannot be read"):
        load(str(tmp_path / "d"))  # a directory without recipe.toml


def test_the_cli_says_it_in_one_line(tmp_path: Path) -> None:
    bad = _write(tmp_path, GOOD.replace("{model_url}", "{url}"))
    r = CliRunner().invoke(cli.app, ["probe", "--harness", str(bad), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("durable-spaces: error: recipe ") and "{url}" in line
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(cli.app, ["probe", "--harness", str(FAKES / "correct"),
                                     "--fault", "quake", "--out", str(tmp_path / "o")])  # fmt: skip
    assert r.exit_code == 2 and "--fault quake: one of" in r.stderr
    assert not (tmp_path / "o").exists()


def test_the_task_takes_file_tools_where_declared(tmp_path: Path) -> None:
    bare = load(str(write_recipe(tmp_path / "a", "none")))
    kinds = [s.kind for s in plan(7, bare, "0" * 8)]
    assert kinds == ["append", "append", "long", "append", "background", "append", "append"]
    files = write_recipe(tmp_path / "b", "none")
    files.write_text(
        files.read_text() + '[write_tool]\nname = "write"\n'
        '[edit_tool]\nname = "edit"\nold = "old_text"\nnew = "new_text"\n'
    )
    r = load(str(files))
    assert [s.kind for s in plan(5, r, "0" * 8)] == ["append", "write", "long", "edit",
                                                      "background"]  # fmt: skip
