"""One probe run: launch the harness, fault it at the planned point, resume it, check.

The run's attempts (the launch, then ``resume`` after a non-zero exit, a kill or
``timeout_s``) go on until one exits 0 or the recipe's ``attempts`` are used up (then the
run is ``stuck``). The planned point is armed until it is reached, in whichever attempt.
At a kill point the fault comes at once; then the gates are opened (``late``) and held
answers released, so whatever escaped the kill goes on and its late effects are seen. At
``exited`` the harness is stopped (SIGSTOP) before the held command goes on to exit, so
the kill lands after the command's exit and before the harness saw it. Under ``power``
the state directory is a powerfs mount, cut right after the kill (power.py). After the last
attempt the lab waits for an escaped held command to finish, kills everything the run
started, and checks the workspace and the requests (checker.py).

A launch or resume program that cannot start (the shell's 126 or 127, or no program to
execute at all) ends the run as a ``recipe_error``: the recipe's fault, never a grade of
the harness. The uninterrupted run, when it needed no resume, tries the resume command
once on its finished state (``trial``) for the same reason: a resume program that cannot
start is found before the planned runs depend on it.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_spaces.probe import checker, task
from durable_spaces.probe import recipe as recipes
from durable_spaces.probe.effect_server import EffectServer
from durable_spaces.probe.faults import CANNOT_START, KILL_FAULTS, HarnessProcess, RunProcs
from durable_spaces.probe.gates import COMMAND_WHERE, Gate, GatePoint
from durable_spaces.probe.model_server import ModelServer
from durable_spaces.probe.power import StateDisk
from durable_spaces.probe.record import ProbeRecord

__all__ = ["ProbeRun", "run_one"]

#: What the lab sets for every harness (then the recipe's [env]).
LAB_ENV = {
    "OPENAI_API_KEY": "dummy", "DO_NOT_TRACK": "1", "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "PI_OFFLINE": "1", "PI_TELEMETRY": "0", "DBOS__CLOUD": "false", "DBOS_TELEMETRY": "false",
    "ANONYMIZED_TELEMETRY": "false", "LANGCHAIN_TRACING_V2": "false",
    "PYTHONUNBUFFERED": "1",
}  # fmt: skip


@dataclass(frozen=True)
class ProbeRun:
    recipe: recipes.Recipe
    run_id: str
    seed: str
    scenario: str
    fault: str
    steps: int
    point: GatePoint | None
    work: Path  # this run's directory (made afresh)
    runs_dir: Path  # where its record and requests go
    use_cgroup: bool = True
    stop: threading.Event | None = None  # set: no further attempt (the probe is stopping)
    per_step: bool = False  # the model's call ids per step (the older scheme), not per answer
    baseline: dict[int, str] | None = None  # file steps' results in the uninterrupted run
    trial: bool = False  # try the resume command once after an uninterrupted finish
    state: bool = False  # the state directory on powerfs, its operations counted (state.py)
    effects: bool = False  # shell steps call an effect server too (effect_server.py)


def cgroup_prefix() -> str:
    """This process's runs' cgroups are named with it (so a stopping probe finds them)."""
    return f"probe-{os.getpid()}-"


def _poll_exit(procs: RunProcs, pid: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while procs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.0005)


class CannotStart(Exception):
    """A launch or resume program that cannot start."""


def run_swaps(nonce: str, work: Path) -> dict[str, str]:
    """What differs between two runs' results for the same step (shown.normalize)."""
    return {nonce: "<nonce>", str(work): "<run>", str(work.resolve()): "<run>"}


class _Run:
    def __init__(self, spec: ProbeRun) -> None:
        self.spec = spec
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.landed_at: float | None = None
        self.gate: Gate | None = None
        self.escaped: int | None = None
        self.disk: StateDisk | None = None
        self.cut: dict[str, Any] | None = None  # what the power cut dropped

    def reached(self, p: GatePoint) -> None:
        self.events.put(("point", p))

    def fault(self, procs: RunProcs, server: ModelServer, a: HarnessProcess, p: GatePoint) -> None:
        self.landed_at = time.monotonic()
        s = self.spec
        if s.fault not in KILL_FAULTS:
            return  # the server did it (an error, a cut, a late answer)
        if p.state and self.disk is not None:  # held inside the harness's state write
            disk = self.disk
            if s.fault == "power":
                procs.kill(s.fault, a, between=lambda: setattr(self, "cut", disk.cut()))
            else:
                procs.kill(s.fault, a, between=disk.release)
            server.release()
            return
        if p.where == "exited" and self.gate is not None:
            pid = self.gate.pid()
            procs.stop_all_but(s.fault, a, pid or -1)
            self.gate.open("go")
            if pid is not None:
                _poll_exit(procs, pid, s.recipe.timeout_s)
        procs.kill(s.fault, a)
        if self.disk is not None:
            self.cut = self.disk.cut()
        if self.gate is not None:
            self.escaped = self.gate.pid() if p.where != "exited" else None
            self.gate.open("late")
        server.release()

    def attempt(self, procs: RunProcs, server: ModelServer, label: str, argv: list[str],
                cwd: Path, env: dict[str, str],
                ) -> tuple[dict[str, Any], HarnessProcess]:  # fmt: skip
        s = self.spec
        try:
            a = procs.start(argv, cwd, env)
        except OSError as e:  # no cgroup's shell in front: the program itself is missing
            raise CannotStart(f"the {label} program {argv[0]} cannot start: {e.strerror}") from e

        def wait() -> None:
            self.events.put(("exit", (a, a.wait())))

        threading.Thread(target=wait, daemon=True).start()
        deadline: float | None = time.monotonic() + s.recipe.timeout_s
        info: dict[str, Any] = {"command": label}
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                what, val = self.events.get(timeout=left)
            except queue.Empty:
                info["timed_out"] = True
                procs.kill("process", a)
                deadline = None
                continue
            if what == "point":
                info["fault"] = str(val)
                self.fault(procs, server, a, val)
                if self.cut is not None:
                    info["dropped"] = self.cut
                continue
            got, rc = val
            if got is a:
                break
        info.update(rc=rc, ms=round(a.duration_s * 1000, 1))
        if rc in CANNOT_START and not info.get("timed_out") and "fault" not in info:
            raise CannotStart(f"the {label} command cannot start (exit {rc}: "
                              f"{a.last_line() or 'no output'})")  # fmt: skip
        return info, a

    def run(self) -> ProbeRecord:
        s, r = self.spec, self.spec.recipe
        t0 = time.monotonic()
        if s.work.exists():
            shutil.rmtree(s.work)
        workdir, state, gates = s.work / "work", s.work / "state", s.work / "gates"
        for d in (workdir, state, gates):
            d.mkdir(parents=True)
        steps = task.plan(s.steps, r, task.nonce_of(s.seed))
        rec = ProbeRecord(
            harness=r.name, recipe=str(r.path), run_id=s.run_id, seed=s.seed,
            scenario=s.scenario, fault=s.fault, steps=s.steps, point=s.point,
            call_ids="per-step" if s.per_step else "per-answer", effects=s.effects,
        )  # fmt: skip
        swaps = run_swaps(task.nonce_of(s.seed), s.work)
        effects = EffectServer() if s.effects else None
        server = ModelServer(steps, r, gates, s.seed, s.per_step, s.baseline, swaps,
                             effects.url if effects is not None else None)  # fmt: skip
        procs = RunProcs(f"{cgroup_prefix()}{s.run_id}-{task.nonce_of(s.seed)}",
                         task.nonce_of(s.seed) + s.run_id, s.use_cgroup)  # fmt: skip
        attempts: list[HarnessProcess] = []
        try:
            if s.fault == "power" or s.state:
                self.disk = StateDisk(state, s.work / "state-disk", s.seed)
            if s.point is not None and s.point.state and self.disk is not None:
                self.disk.arm(s.point, gates / "state.trap", self.reached)
            elif s.point is not None and s.point.where in COMMAND_WHERE:
                self.gate = Gate(gates, s.point, self.reached)
            elif s.point is not None:
                server.arm(s.point, s.fault, self.reached)
            vals = recipes.values(r, model_url=server.url, workdir=workdir, state_dir=state,
                                  run_id=s.run_id, prompt=task.prompt_of(s.steps))  # fmt: skip
            env = {**os.environ, **LAB_ENV, "OPENAI_BASE_URL": server.url,
                   "PROBE_RUN_ID": s.run_id}  # fmt: skip
            env.update({k: recipes.resolve(v, vals) for k, v in r.env.items()})
            launch = [recipes.resolve(x, vals) for x in r.launch]
            resume = [recipes.resolve(x, vals) for x in r.resume]
            ok = False
            cannot: str | None = None
            for i in range(r.attempts):
                if s.stop is not None and s.stop.is_set():
                    break
                label, argv = ("launch", launch) if i == 0 else ("resume", resume)
                try:
                    info, a = self.attempt(procs, server, label, argv, workdir, env)
                except CannotStart as e:
                    cannot = str(e)
                    break
                attempts.append(a)
                rec.attempts.append(info)
                if server.problems:
                    break
                if info["rc"] == 0 and not info.get("timed_out"):
                    ok = True
                    break
            if self.gate is not None and self.landed_at is None:
                self.gate.open("never")  # not reached: the FIFO goes
            if self.disk is not None and self.landed_at is None:
                self.disk.disarm()
            if self.escaped is not None:
                _poll_exit(procs, self.escaped, r.timeout_s)
            asked = len(server.requests)
            if s.state and s.point is None and self.disk is not None:
                rec.state_ops = state_ops(self.disk.ops(), server)
            outside = effects.counts() if effects is not None else None
            results = checker.check(steps, workdir, server.requests, ok, r.report,
                                    s.baseline, swaps, outside)  # fmt: skip
            if s.trial and ok and cannot is None and len(attempts) == 1:
                cannot = self.trial(procs, server, resume, workdir, env, rec, attempts)
        finally:
            procs.close()
            server.close()
            if effects is not None:
                effects.close()
            if self.disk is not None:
                self.disk.close()
        for info, a in zip(rec.attempts, attempts, strict=True):
            info["last_line"] = a.last_line()
        rec.landed = self.landed_at is not None
        if self.disk is not None and self.disk.hit is not None:
            hit = self.disk.hit
            rec.state_hit = {"op": hit["op"], "n": hit["n"], "path": hit["path"], "step": 0}
        requests = server.requests[:asked]
        rec.requests = len(requests)
        rec.harness_ms = sum(a.duration_s for a in attempts) * 1000
        if cannot is not None:
            rec.outcome, rec.reason = "recipe_error", cannot
        elif server.problems:
            rec.outcome, rec.reason = "refused", server.problems[0]
        elif not ok:
            rec.outcome, rec.reason = "stuck", _stuck_reason(rec.attempts, len(requests))
        rec.results = results
        if s.point is None:
            rec.reached = [str(p) for p in reached_points(steps, requests, rec.results)]
            rec.reached += [f"{op['op']}@{op['n']}" for op in rec.state_ops]
            rec.baseline = checker.baseline_of(steps, requests, swaps)
        else:
            rec.baseline = dict(s.baseline or {})
        s.runs_dir.mkdir(parents=True, exist_ok=True)
        (s.runs_dir / f"{s.run_id}.requests.json").write_text(json.dumps(requests) + "\n")
        if effects is not None:
            text = json.dumps(effects.requests) + "\n"
            (s.runs_dir / f"{s.run_id}.effects.json").write_text(text)
        rec.duration_ms = (time.monotonic() - t0) * 1000
        return rec

    def trial(self, procs: RunProcs, server: ModelServer, resume: list[str], cwd: Path,
              env: dict[str, str], rec: ProbeRecord,
              attempts: list[HarnessProcess]) -> str | None:  # fmt: skip
        """The resume command once on the finished run's state: why it cannot start, or
        None (what it does otherwise is not graded)."""
        try:
            info, a = self.attempt(procs, server, "resume", resume, cwd, env)
        except CannotStart as e:
            return str(e)
        rec.attempts.append({**info, "command": "resume (trial)"})
        attempts.append(a)
        return None


def state_ops(ops: list[tuple[str, int, str, float]],
              server: ModelServer) -> list[dict[str, Any]]:  # fmt: skip
    """The uninterrupted run's state operations, each with the step under way when it was
    made (the step of the last request the model had received by then; 0 before any)."""
    times = [(server.t0 + q["t_ms"] / 1000, q.get("step")) for q in server.requests]
    out = []
    for kind, n, path, t in ops:
        step = 0
        for at, k in times:
            if at > t:
                break
            step = k if isinstance(k, int) else step
        out.append({"op": kind, "n": n, "path": path[:4096], "step": step})
    return out


def _stuck_reason(attempts: list[dict[str, Any]], requests: int) -> str:
    last = attempts[-1]
    how = "timed out" if last.get("timed_out") else f"exited {last['rc']}"
    where = "" if requests else " before calling the model"
    line = f": {last['last_line']}" if last.get("last_line") else ""
    n = len(attempts)
    return f"{n} attempt{'s' if n > 1 else ''}; the last {how}{where}{line}"


def reached_points(steps: list[task.Step], requests: list[dict[str, Any]],
                   results: list[checker.StepResult]) -> list[GatePoint]:  # fmt: skip
    """The points an uninterrupted run went through: every request's, and the command
    points of every shell step that had its effect."""
    out: set[GatePoint] = set()
    for q in requests:
        k = q.get("step")
        if isinstance(k, int) and q.get("answer") in ("tool", "final"):
            out.update((GatePoint(k, "request"), GatePoint(k, "stream")))
    for res in results:
        if res.effects and steps[res.step - 1].shell:
            out.update(GatePoint(res.step, w) for w in COMMAND_WHERE)
    return sorted(out)


def run_one(spec: ProbeRun) -> ProbeRecord:
    """The run ``spec`` describes, as a record (a lab failure becomes ``lab_error``)."""
    try:
        return _Run(spec).run()
    except Exception as e:  # the lab broke, not the harness: say so, keep going
        return ProbeRecord(harness=spec.recipe.name, recipe=str(spec.recipe.path),
                         run_id=spec.run_id, seed=spec.seed, scenario=spec.scenario,
                         fault=spec.fault, steps=spec.steps, point=spec.point,
                         outcome="lab_error", reason=f"{type(e).__name__}: {e}")  # fmt: skip
