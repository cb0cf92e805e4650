"""The adapter's ``bash``, ``write`` and ``edit`` as the tools of the agent frameworks
people use, so that a crash and the framework's own resume leave the Space as if each
call ran once: ``langgraph``, ``openai_agents``, ``pydantic_ai`` (each imports its
framework: ``pip install 'durable-spaces[langgraph]'`` and so on). What they share:
``workspace.py`` (``DurableWorkspace``, where the tools act), ``attempt.py`` (one
process's epoch and log) and ``threads.py`` (each thread's calls in the log, and the
Space kept to what the framework's own checkpoint holds). This package imports none of
the frameworks; docs/integrations.md says what "once" means in each.
"""

from __future__ import annotations

from durable_spaces.integrations.threads import FrameworkCall, Knowledge
from durable_spaces.integrations.workspace import DurableWorkspace

__all__ = ["DurableWorkspace", "FrameworkCall", "Knowledge"]
