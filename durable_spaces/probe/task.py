"""The probe's task: K steps, each with a token that names it in every trace it leaves.

Step k's effect in the workspace and its output (what the model is shown when it ran) both
carry its token, so the checker can count effects per step and tell the step's own output
from an error or a made-up result. The command never spells its effect or output line
literally (``printf`` joins the pieces), so a harness that echoes the command back does not
show the model the output it did not produce.

Workloads (``plan``): appends ``E <token>`` to ``log.txt`` through the shell tool (the
default); a whole write and a line edit of ``notes.txt`` through the harness's own file
tools when the recipe declares them; a step that leaves a background process; a long step.
A shell step's command holds itself at the lab's gates (gates.py) when the lab made them:
after its start (before its effect), after its effect, and just before it exits.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from durable_spaces.probe.recipe import Recipe

__all__ = ["LOG", "NOTES", "Step", "nonce_of", "plan", "prompt_of"]

LOG = "log.txt"
NOTES = "notes.txt"
#: The kinds in the order a task of K steps takes them (then appends).
ORDER = ("append", "write", "long", "edit", "background")
#: How long the long step sleeps before its effect, and the background process lives.
LONG_S = 0.5
BACKGROUND_S = 30


def nonce_of(seed: str) -> str:
    """A run's nonce: eight hex digits drawn from its seed (tokens are ``p<nonce>s<k>``)."""
    return hashlib.sha256(seed.encode()).hexdigest()[:8]


def prompt_of(steps: int) -> str:
    return (f"Carry out the {steps} steps the model gives you, one tool call at a time, "
            "then stop.")  # fmt: skip


@dataclass(frozen=True)
class Step:
    k: int  # 1-based
    kind: str  # append | write | edit | background | long
    nonce: str

    @property
    def token(self) -> str:
        return f"p{self.nonce}s{self.k}"

    def call_id(self, seed: str, answer: int, per_step: bool) -> str:
        """The id of the model's tool call for this step in its ``answer``-th answer: new at
        every answer, as a real model gives them (a pure function of the run's seed and the
        answer's index, so a seed replays), or the step's own (``per_step``: the older
        scheme, under which a harness that asks the model again after a crash gets the same
        id for the same step and can pass for one that never asked)."""
        if per_step:
            return f"call_{self.nonce}_{self.k}"
        return "call_" + hashlib.sha256(f"{seed}/{answer}".encode()).hexdigest()[:24]

    @property
    def effect_line(self) -> str:
        """What the effect writes: a line of log.txt, or notes.txt's written or edited text."""
        return f"W {self.token}" if self.kind == "write" else f"E {self.token}"

    @property
    def output_line(self) -> str:
        return f"O {self.token}"

    @property
    def shell(self) -> bool:
        return self.kind not in ("write", "edit")

    def command(self, gates: Path, tag: str = "", effects: str | None = None) -> str:
        """The POSIX sh command of a shell step; ``gates`` is the lab's gate directory
        (absolute, outside the workdir); ``tag`` (``a<answer>``) names the answer that asked
        for it in its effect line, so the checker tells a call the harness ran twice from
        a step the model asked for twice; ``effects``, the effect server's URL: right after
        its effect the step POSTs there too, with the harness's ``DS_CALL_KEY`` as its
        ``Idempotency-Key`` when there is one (effect_server.py)."""
        g = shlex.quote(str(gates))
        k = self.k
        parts = [f"p{self.nonce}", f"s{k}"]
        hold = "[ -p {g}/{k}.{p} ] && {{ echo $$ > {g}/{k}.pid; read -r {v} < {g}/{k}.{p}; }}"
        lines = [hold.format(g=g, k=k, p="started", v="t") + ";"]
        if self.kind == "long":
            lines.append(f"sleep {LONG_S};")
        # The effect: its line, tagged with what the started gate said (``late`` when the
        # lab opened it after a kill: an effect of a killed attempt's process).
        mark = shlex.quote(f" {tag}") if tag else "''"
        lines.append(
            f"printf 'E %s%s%s%s\\n' {parts[0]} {parts[1]} {mark} \"${{t:+ $t}}\" >> {LOG};"
        )
        if effects is not None:
            url = shlex.quote(f"{effects}/effect/")
            key = '${DS_CALL_KEY:+-H "Idempotency-Key: $DS_CALL_KEY"}'
            lines.append(
                f"curl -s -o /dev/null --max-time 30 -X POST {key} {url}{parts[0]}{parts[1]};"
            )
        if self.kind == "background":
            lines.append(f"(sleep {BACKGROUND_S} </dev/null >/dev/null 2>&1 &);")
        lines.append(hold.format(g=g, k=k, p="effect", v="u") + ";")
        lines.append(f"printf 'O %s%s\\n' {parts[0]} {parts[1]};")
        lines.append(hold.format(g=g, k=k, p="exited", v="v") + "; true")
        return " ".join(lines)

    def arguments(self, recipe: Recipe, gates: Path, tag: str = "",
                  effects: str | None = None) -> tuple[str, str]:  # fmt: skip
        """The tool this step calls and its JSON arguments (``effects``: ``command``'s)."""
        if self.kind == "write" and recipe.write_tool is not None:
            a = recipe.write_tool.args
            text = f"{self.effect_line}\nslot {self.nonce}\n"
            return recipe.write_tool.name, json.dumps({a["path"]: NOTES, a["content"]: text})
        if self.kind == "edit" and recipe.edit_tool is not None:
            a = recipe.edit_tool.args
            args = {a["path"]: NOTES, a["old"]: f"slot {self.nonce}", a["new"]: self.effect_line}
            return recipe.edit_tool.name, json.dumps(args)
        command = self.command(gates, tag, effects)
        return recipe.tool.name, json.dumps({recipe.tool.argument: command})


def plan(steps: int, recipe: Recipe, nonce: str) -> list[Step]:
    """The task's steps: ``ORDER``'s kinds, a file step only where the recipe has its tool
    (an edit only after the write it edits), appends after."""
    out: list[Step] = []
    wrote = False
    for k in range(1, steps + 1):
        kind = ORDER[k - 1] if k <= len(ORDER) else "append"
        if kind == "write" and recipe.write_tool is None:
            kind = "append"
        if kind == "edit" and (recipe.edit_tool is None or not wrote):
            kind = "append"
        wrote = wrote or kind == "write"
        out.append(Step(k, kind, nonce))
    return out
