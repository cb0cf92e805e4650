"""``durable-spaces probe``: crash-test any agent harness, unmodified, from outside.

Jepsen's idea for agent harnesses: a black-box client (the harness, run by its recipe), a
nemesis (a kill at a point the lab holds exactly, or a model-side fault), and a checker of
what was observed (the workspace and the requests the model received). The product never
imports this room.

recipe.py (a harness's recipe), task.py (the steps and their commands), model_server.py (the
scripted model), gates.py (kill points held exactly), faults.py (the kills and the run's
processes), runner.py (one run), plan.py (which runs, from seeds or the uninterrupted run),
checker.py (each step's class), grade.py (a harness's grade), record.py (run records, the
SUMMARY line), whole_probe.py (a whole probe), report.py (report.md/html, --compare).
"""
