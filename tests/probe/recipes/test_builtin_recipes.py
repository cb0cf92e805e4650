"""Every built-in recipe, read as the contract says (no harness needed): the names
``BUILTIN`` lists, each in a directory of its name; only known placeholders; the programs its
commands name exist; a one-line promise the report can show; a shell tool, and file tools
with every argument named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from recipe_trial import PLACEHOLDERS, RECIPES, load

BUILTIN = {
    "pi", "langgraph", "langgraph-async", "pydantic-ai-dbos", "pydantic-ai-dbos-steps",
    "openai-agents", "durable-spaces", "durable-spaces-checkpoint", "langgraph-durable",
    "langgraph-async-durable", "openai-agents-durable", "pydantic-ai-dbos-durable",
}  # fmt: skip


def test_the_built_in_recipes_are_the_issues() -> None:
    assert {d.name for d in RECIPES.iterdir() if (d / "recipe.toml").is_file()} == BUILTIN


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_a_built_in_recipe_is_well_formed(name: str) -> None:
    r = load(name)
    d = r.data
    assert set(d) <= {"name", "launch", "resume", "timeout_s", "attempts", "promise",
                      "available", "tool", "write_tool", "edit_tool", "env", "report"}  # fmt: skip
    for key in ("launch", "resume", "available"):
        argv = d[key]
        assert isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
        words = [*argv, *d.get("env", {}).values()]
        for word in words:
            for field in re.findall(r"\{([^{}]*)\}", word):
                assert field in PLACEHOLDERS, (key, word)
        for word in argv:  # a program of the recipe's own: it exists
            if word.startswith("{recipe_dir}/"):
                assert (r.directory / word.removeprefix("{recipe_dir}/")).is_file(), word
    assert "{prompt}" in " ".join(d["launch"])
    promise = d["promise"]
    assert isinstance(promise, str) and promise and "\n" not in promise and len(promise) <= 200
    assert d["tool"] == {"name": "bash", "argument": "command"}
    if "write_tool" in d:
        assert set(d["write_tool"]) == {"name", "path", "content"}
    if "edit_tool" in d:
        assert "write_tool" in d and set(d["edit_tool"]) == {"name", "path", "old", "new"}
    assert 0 < d["timeout_s"] <= 600


def test_every_program_is_named_by_a_recipe() -> None:
    """No stray program: each file beside a recipe is one some recipe runs."""
    named = {
        (load(n).directory / w.removeprefix("{recipe_dir}/")).resolve()
        for n in BUILTIN
        for k in ("launch", "resume", "available")
        for w in load(n).data[k]
        if w.startswith("{recipe_dir}/")
    }
    programs = {p.resolve() for p in RECIPES.glob("*/*") if p.suffix in (".py", ".sh")}
    assert programs == named, programs ^ named


def test_recipes_live_where_the_package_data_says() -> None:
    pyproject = (RECIPES.parents[2] / "pyproject.toml").read_text()
    assert (
        '"durable_spaces.probe" = ["recipes/*/recipe.toml", "recipes/*/*.py", "recipes/*/*.sh"]'
        in pyproject
    )
    assert all(
        Path(p).suffix in (".toml", ".py", ".sh")
        for p in RECIPES.glob("*/*")
        if Path(p).is_file() and "__pycache__" not in str(p)
    )
