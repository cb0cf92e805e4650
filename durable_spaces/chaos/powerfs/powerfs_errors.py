"""The errors a power-loss mount raises (typed, so a chaos lab can tell them apart)."""

from __future__ import annotations

from durable_spaces.errors import DurableSpacesError


class PowerFSError(DurableSpacesError):
    """The power-loss filesystem could not do what was asked (mount, cut, unmount)."""


class FuseUnavailableError(PowerFSError):
    """This machine cannot run a FUSE server (no /dev/fuse, no libfuse3, no mfusepy)."""
