"""The durable log and a minimal durable agent harness (Pi Durable's rules), knowing
nothing of Spaces beyond the ``ExecutionEnv`` protocol.

``log`` (storages and fences: the only SQL), ``state`` (what the committed ops imply),
``scheduler`` (the ``Harness``: generation and tool tasks over the log), ``tools``,
``env``, ``models``."""
