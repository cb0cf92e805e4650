"""The ``journal_kill`` fault: the change journal's helper in a Space killed by a command
in the Space, as the OOM killer can; one nemesis (``nemesis.py``'s protocol)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from durable_spaces.chaos.nemesis import Op, _done

if TYPE_CHECKING:
    from durable_spaces.space import Space, SpaceBackend


#: Kills the change journal's helpers of the workspace ``$ARGV[0]`` (a process whose
#: argv is ``perl -e SCRIPT <workspace> ...``, as ``spacesd/guest_journal.py`` starts it,
#: this one aside) and prints how many. perl: the helper's own language, so whatever Space
#: runs a helper can run this; its argv holds newlines, which a shell's read would split.
KILL_JOURNAL = r"""my $root = shift; my $n = 0;
opendir(my $d, '/proc') or die "no /proc: $!";
for my $p (grep { /^\d+$/ && $_ != $$ } readdir $d) {
    open(my $f, '<:raw', "/proc/$p/cmdline") or next;
    my @a = split /\0/, do { local $/; <$f> } // '', -1;
    $n += kill('KILL', $p) if @a >= 4 && $a[0] eq 'perl' && $a[1] eq '-e' && $a[3] eq $root;
}
print "killed $n\n";
"""


async def kill_journal(space: Space) -> int:
    """SIGKILL ``space``'s change-journal helpers by a command in the Space at its current
    epoch. How many. Where the Space can run a command as its daemon's user
    (``spawn(as_daemon=True)``: a cua-spacesd Space), it runs as that: the helper runs
    so too, out of the Space's user's reach (``docs/journal-trust.md``), and what still
    kills it (the OOM killer, a crash) is no command of that user. Elsewhere it is a
    command of the Space's user, which is also the helper's."""
    epoch = await space.current_epoch()
    argv = ["perl", "-e", KILL_JOURNAL, space.root]
    if "as_daemon" in inspect.signature(space.spawn).parameters:
        ex = await space.spawn(argv, key=None, epoch=epoch, as_daemon=True)  # type: ignore[call-arg]
        res = await ex.wait()
    else:
        res = await space.exec(argv, key=None, epoch=epoch)
    words = res.output.decode(errors="replace").split()
    if res.exit_code != 0 or len(words) != 2 or words[0] != "killed" or not words[1].isdigit():
        raise RuntimeError(f"the helper's kill exited {res.exit_code}: {res.output[-200:]!r}")
    return int(words[1])


class JournalKiller:
    """``journal_kill``: the change journal's helper in the Space (``guest_journal.pl``)
    killed by a command in the Space (``kill_journal``), as the OOM killer can (or a
    command of the Space's user, where the helper runs as that user): the driver's next
    scan must find it gone and scan its own way, never answer from what it kept. ``ok``
    with how many helpers were killed (0: none ran, e.g. the Space scanned on the host);
    ``info`` on an error."""

    kinds = frozenset({"journal_kill"})

    def __init__(self, backend: SpaceBackend, name: str) -> None:
        self.backend = backend
        self.name = name

    async def invoke(self, op: Op) -> Op:
        try:
            space = await self.backend.find(self.name)
            if space is None:
                return _done(op, "info", error=f"no Space {self.name!r}")
            killed = await kill_journal(space)
        except Exception as e:
            return _done(op, "info", error=f"{type(e).__name__}: {e}")
        return _done(op, "ok", found={"killed": killed})
