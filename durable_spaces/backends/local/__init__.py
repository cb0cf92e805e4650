"""Backend ``local``: a Space that is a directory on this machine (the stand-in the design
names). ``backend`` (the backend and the layout), ``local_space`` (the Space, its epochs and
files), ``execution`` (following one command), ``ledger`` (the exec ledger and records),
``procs`` (the Space's processes: liveness, kill, reap), ``disk`` (atomic files),
``fs`` (confined file operations and the incremental scanner), ``supervisor`` (one
command's keeper), ``forkserver`` / ``forkserver_client`` (the Space's fork server of
supervisors, and how a caller finds, starts and asks it)."""

from durable_spaces.backends.local.backend import LocalBackend, LocalSpace, unavailable_reason

__all__ = ["LocalBackend", "LocalSpace", "unavailable_reason"]
