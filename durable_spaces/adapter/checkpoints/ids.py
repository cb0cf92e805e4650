"""Checkpoint ids: the one parser every id read back from a log, a store or a Space passes.

An id becomes a file name (``<store>/<id>.manifest``, ``.ds-checkpoints/<id>.tar``, a
microVM's ``checkpoints/<id>/``) and a word of shell commands, and it is read back from
places a crash, a bug or an agent can damage. So nothing uses an id that did not parse here.

Two kinds, never confused (only a workspace id has a ``-``):

- **workspace** (``WorkspaceSnapshots``), in two forms:

  - ``manifest`` (every new checkpoint): ``<slug>-m<digest>``, the slug from the call id
    (``[A-Za-z0-9_-]``, 1 to 40), the digest the whole sha256 of the manifest
    (``manifest.py``) in lowercase hex. The ``m`` is no hex digit, so no tar id is ever
    read as a manifest id or the other way round.
  - ``tar`` (checkpoints older adapters left in stores and Spaces, still restored):
    ``<slug>-<digest>``, the digest the sha256 of the tar: all 64 digits, 32 or more
    accepted, and the old 16-digit form still read.

  A restore checks the bytes against the digest before using anything.
- **machine** (the microVM backend): 24 lowercase hex digits.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from durable_spaces.errors import BadCheckpointIdError

Kind = Literal["workspace", "machine"]
Form = Literal["tar", "manifest", "machine"]

SLUG_MAX = 40
#: Digest lengths of workspace ids: the legacy 16, and 32..64 (new ids use all 64).
LEGACY_DIGEST = 16
MIN_DIGEST = 32

_WORKSPACE = re.compile(rf"([A-Za-z0-9_-]{{0,{SLUG_MAX}}})-([0-9a-f]{{16}}|[0-9a-f]{{32,64}})")
_MANIFEST = re.compile(rf"([A-Za-z0-9_-]{{1,{SLUG_MAX}}})-m([0-9a-f]{{64}})")
_MACHINE = re.compile(r"[0-9a-f]{24}")
_SLUG_BAD = re.compile(r"[^A-Za-z0-9_-]")


class CheckpointId(str):
    """A checkpoint id known to be well formed (a ``str``, so it goes wherever ids went).

    Build one with ``parse`` (an id read back from anywhere), ``valid`` (a listing: junk
    is skipped, not an error), ``for_tar`` or ``machine``; the constructor parses too."""

    kind: Kind
    form: Form  # how a workspace checkpoint is kept: a manifest (+ blobs) or one tar
    digest: str  # workspace ids: the (maybe shortened) sha256 of its bytes; "" otherwise

    def __new__(cls, value: object, where: str = "a checkpoint id") -> CheckpointId:
        if isinstance(value, CheckpointId):
            return value
        if isinstance(value, str):
            if m := _MANIFEST.fullmatch(value):
                self = super().__new__(cls, value)
                self.kind, self.form, self.digest = "workspace", "manifest", m.group(2)
                return self
            if m := _WORKSPACE.fullmatch(value):
                self = super().__new__(cls, value)
                self.kind, self.form, self.digest = "workspace", "tar", m.group(2)
                return self
            if _MACHINE.fullmatch(value):
                self = super().__new__(cls, value)
                self.kind, self.form, self.digest = "machine", "machine", ""
                return self
        raise BadCheckpointIdError(value, where)

    def __reduce__(self) -> tuple[type[CheckpointId], tuple[str]]:
        return (CheckpointId, (str(self),))  # copy/deepcopy/pickle re-parse it

    @classmethod
    def parse(
        cls, value: object, where: str = "a checkpoint id", kind: Kind | None = None
    ) -> CheckpointId:
        """The id ``value``, or ``BadCheckpointIdError`` saying where it came from (a
        ``PermanentFailure``: an id the log records that does not parse means the log is
        damaged). ``kind`` also requires that kind."""
        cid = cls(value, where)
        if kind is not None and cid.kind != kind:
            raise BadCheckpointIdError(value, where, f"not a {kind} checkpoint id")
        return cid

    @classmethod
    def valid(cls, value: object, kind: Kind | None = None) -> CheckpointId | None:
        """The id, or None when ``value`` is not one (a file name in a listing)."""
        try:
            return cls.parse(value, kind=kind)
        except BadCheckpointIdError:
            return None

    @classmethod
    def for_manifest(cls, call_id: str, data: bytes) -> CheckpointId:
        """The id of a new workspace checkpoint: the call's slug and the manifest's sha256."""
        return cls(f"{slug(call_id)}-m{hashlib.sha256(data).hexdigest()}")

    @classmethod
    def for_tar(cls, call_id: str, data: bytes) -> CheckpointId:
        """The id a tar checkpoint has (as older adapters took them; tests make them)."""
        return cls(f"{slug(call_id)}-{hashlib.sha256(data).hexdigest()}")

    @property
    def suffix(self) -> str:
        """The file name ending of this checkpoint's bytes in a store or a Space."""
        return ".manifest" if self.form == "manifest" else ".tar"

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` is the manifest or archive this (workspace) id names."""
        return self.kind == "workspace" and hashlib.sha256(data).hexdigest().startswith(self.digest)


def slug(s: str) -> str:
    """A call id as a file-name-safe word (``[A-Za-z0-9_-]``, 1..40 characters)."""
    return _SLUG_BAD.sub("-", s)[:SLUG_MAX] or "x"


def optional(value: object, where: str) -> CheckpointId | None:
    """``parse`` for a field of the log that may be absent (None)."""
    return None if value is None else CheckpointId.parse(value, where)
