"""Backend ``local``: a Space that is a directory on this machine (the stand-in the design
names). ``backend`` (the Space, its commands and epochs), ``fs`` (confined file
operations and the incremental scanner), ``supervisor`` (one command's keeper)."""

from durable_spaces.backends.local.backend import LocalBackend, LocalSpace, unavailable_reason

__all__ = ["LocalBackend", "LocalSpace", "unavailable_reason"]
