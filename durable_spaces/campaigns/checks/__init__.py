"""The checker's parts: raw inputs read without the adapter, and named anomalies.

``durable_spaces.campaigns.checker`` composes them; each module here is one idea:

- ``rawlog``: the log's bytes (SQLite through ``sqlite3`` read-only, JSONL through
  ``json``) as commits; ``history``: those commits as a transcript;
- ``workspace``: the workspace as nodes (bytes, modes, symlink targets, directories,
  special files, times), walked on the host or parsed from a tar streamed out of the
  Space; ``processes``: what still runs in the Space;
- ``workload``: the checker's own interpreter of the scripted workload's effects;
- the checks: ``effects`` (lost, duplicate, phantom, torn), ``epochs`` (stale commits,
  two drivers at one epoch, stale writes), ``image`` (the transactional image),
  ``replay`` (every call the one the model would ask for), ``processes``, ``server``
  (the ``server`` workload's process came back with a restore);
- ``kept``: a run's inputs kept on disk so ``durable-spaces check`` can re-run them.

Nothing here imports the adapter's storage, scanner or image code: what is under test
must not be the instrument that measures it.
"""
