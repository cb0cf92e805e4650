"""``python -m durable_spaces.cli``: the same command as ``durable-spaces``."""

from durable_spaces.cli import main

main()
