"""When transactional mode's scans may trust a change journal, end to end through the
adapter (docs/journal-trust.md): a mount inside the workspace, whenever it was made, makes
the journal in the Space (``backends/spacesd/guest_journal.pl``) untrusted, as it makes
the host's; the image then still follows the Space.

A real harness, real daemons; the image is compared with what the Space's daemon itself
sees (its own ``find``, no journal), since a mount in the daemon's namespace is not
visible from this host.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from wrapped_harness import wrapped_harness

from durable_spaces.adapter import image_log
from durable_spaces.backends import unavailable_reason
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace
from durable_spaces.space import PathTable
from durable_spaces.testing import run_call_list


async def daemon_view(space: Any) -> PathTable:
    """The Space as its daemon's own scan finds it (a new object: no cache, no journal)."""
    other = SpacesdSpace(
        space.name, space.root, space.instance_id, space._url, space._token, space._probe,
        user=space._user, sdk_home=space._sdk_home,
    )  # fmt: skip
    other._guest.unavailable = "the oracle scans without a journal"
    try:
        return await other.scan()
    finally:
        await other.close()


def _files(table: PathTable) -> dict[str, tuple[str, str | None, str | None]]:
    return {p: (e.kind, e.sha256, e.target) for p, e in table.items()}


def _needs(backend: str) -> None:
    if (why := unavailable_reason(backend)) is not None:
        pytest.skip(f"backend {backend} cannot run here: {why}")
    if backend == "spacesd":
        from durable_spaces.backends.spacesd.daemon import unshare_reason

        if (why := unshare_reason()) is not None:  # the mount must stay in the Space
            pytest.skip(f"no namespaces for the Space (its mounts would be this host's): {why}")


@pytest.mark.spacesd
@pytest.mark.parametrize("host_scan", ["0", "1"])
def test_an_overlay_mounted_inside_the_workspace_is_never_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_scan: str
) -> None:
    """A call mounts an overlay at ``ov`` whose upper directory is outside the workspace;
    later writes there raise no event in the workspace. Every later helper must refuse
    to vouch (not take the mount as its baseline), so the scans are the daemon's own and
    the image holds what the Space shows. With the host scan on, the host journal
    refuses the mount and the helper answers: the same rule."""
    _needs("spacesd")
    monkeypatch.setenv("DS_HOST_SCAN", host_scan)
    out = tmp_path / "outside"
    out.mkdir()
    o = str(out)
    calls: list[tuple[str, Any]] = [
        (
            "bash",
            {
                "command": f"mkdir -p {o}/lower {o}/upper {o}/work ov && printf orig > "
                f"{o}/lower/f && mount -t overlay overlay -o lowerdir={o}/lower,"
                f"upperdir={o}/upper,workdir={o}/work ov"
            },
        ),
        ("bash", {"command": "cat ov/f"}),
        ("bash", {"command": f"printf evil > {o}/upper/f && printf g > {o}/upper/g"}),
        ("bash", {"command": "true"}),
        ("bash", {"command": "cat ov/f ov/g"}),
    ]
    after: list[tuple[str, Any]] = [
        ("bash", {"command": "umount ov && printf after > z.txt"}),
        ("bash", {"command": "printf more >> z.txt"}),
    ]

    async def go() -> None:
        async with wrapped_harness(tmp_path, "spacesd", "transactional", calls + after) as (
            h,
            durable,
        ):
            conv, results = await run_call_list(h)
            assert [r["status"] for r in results] == ["ok"] * len(calls + after), results
            space = await durable.space(conv.id)
            # The image as of the call that read the overlay holds what it read there.
            entry = [e for e in conv.entries() if e.kind == "tool_result"][len(calls) - 1]
            then = durable.image_table(h, conv.id, as_of=entry.id)
            blobs = [
                durable.blob(h, conv.id, e.sha256 or "") if (e := then.get(p)) else b"?"
                for p in ("ov/f", "ov/g")
            ]
            shown = results[len(calls) - 1]["content"].rsplit("\n[exit code 0]", 1)[0]
            assert shown.endswith("g") and b"".join(b or b"?" for b in blobs).decode() == shown
            seen = await daemon_view(space)
            assert _files(image_log.table(h, conv.id)) == _files(seen)
            stats = space.scan_stats
            if host_scan == "0":
                # One walk before the mount, none trusted while it was there, a new
                # walk once it went, then the journal again (the call after it).
                assert (stats["guest_full"], stats["guest_journal"]) == (2, 2), stats
            else:  # the host journal refused while the mount was there, then took over
                assert stats["guest_journal"] == 0, stats

    asyncio.run(go())


#: A background process of the Space's user that stops the journal's helper of the
#: workspace ``$ARGV[0]``, opens its stdin and stdout and answers every request itself:
#: its nonce and "trusted", nothing changed. What it could or could
#: not do goes to its own output.
FORGER = r"""
use strict;
my $root = shift;
$| = 1;
my $pid;
for (1 .. 600) {
    opendir(my $d, '/proc') or die "no /proc\n";
    for my $p (grep { /^\d+$/ && $_ != $$ } readdir $d) {
        open(my $c, '<', "/proc/$p/cmdline") or next;
        local $/;
        my @a = split /\0/, (<$c> // '');
        if (@a >= 4 && $a[1] eq '-e' && $a[3] eq $root) { $pid = $p; last; }
    }
    last if $pid;
    select(undef, undef, undef, 0.1);
}
die "no helper found\n" unless $pid;
kill('STOP', $pid) or print "cannot stop the helper: $!\n";
# Tracing it would let this process write anything in its place (x86_64's numbers:
# ptrace, PTRACE_ATTACH 16, PTRACE_DETACH 17).
if (syscall(101, 16, $pid + 0, 0, 0) == 0) {
    print "traced the helper\n";
    waitpid($pid, 0);
    syscall(101, 17, $pid + 0, 0, 0);
} else {
    print "cannot trace the helper: $!\n";
}
# Its descriptor by its /proc path, else a copy of it (pidfd_getfd: x86_64's numbers).
sub grab {
    my ($n, $how) = @_;
    return $_[2] if open($_[2], $how, "/proc/$pid/fd/$n");
    print "cannot open its fd $n: $!\n";
    my $pidfd = syscall(434, $pid + 0, 0);
    die "cannot pidfd_open it: $!\n" if $pidfd < 0;
    my $fd = syscall(438, $pidfd, $n + 0, 0);
    die "cannot pidfd_getfd its fd $n: $!\n" if $fd < 0;
    open($_[2], "$how&=", $fd) or die "fd $fd: $!\n";
    return $_[2];
}
my $in = grab(0, '<', my $i);
my $out = grab(1, '>', my $o);
select((select($out), $| = 1)[0]);
print "forging for $pid\n";
while (my $line = <$in>) {
    chomp $line;
    $line =~ s/^\?//;
    my $body = pack('N/a* N/a*', $line, '');
    print $out 'E' . pack('N', length $body) . $body;
    print "answered $line\n";
}
"""


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("microvm", marks=pytest.mark.microvm),
    ],
)
def test_a_command_cannot_answer_for_the_journals_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A call leaves a process that stops the helper and answers in its place (its nonce,
    "trusted", nothing changed): the helper runs where the Space's user cannot signal it
    or open its descriptors, so the forger gets nowhere, and the image holds the files
    the later calls made, the adapter's own ``write`` among them."""
    _needs(backend)
    monkeypatch.setenv("DS_HOST_SCAN", "0")
    script = FORGER.replace("'", "'\\''")
    calls: list[tuple[str, Any]] = [
        ("bash", {"command": "printf one > a.txt"}),
        (
            "bash",
            {
                "command": f"cd / && nohup perl -e '{script}' \"$OLDPWD\" > /tmp/forger.log "
                "2>&1 < /dev/null & sleep 1; printf two > b.txt"
            },
        ),
        ("bash", {"command": "printf three > c.txt"}),
        ("write", {"path": "d.txt", "content": "written by the adapter\n"}),
        ("bash", {"command": "printf four > e.txt"}),
        ("bash", {"command": "cat /tmp/forger.log"}),
    ]

    async def go() -> None:
        async with wrapped_harness(tmp_path, backend, "transactional", calls) as (h, durable):
            conv, results = await run_call_list(h)
            assert [r["status"] for r in results] == ["ok"] * len(calls), results
            log = results[-1]["content"]
            assert "cannot stop the helper" in log and "cannot trace the helper" in log, log
            assert "forging" not in log, log
            space = await durable.space(conv.id)
            seen = await daemon_view(space)
            assert {"a.txt", "b.txt", "c.txt", "d.txt", "e.txt"} <= set(seen)
            assert _files(image_log.table(h, conv.id)) == _files(seen)
            assert space.scan_stats["guest_journal"] > 0  # the helper still answered

    asyncio.run(go())


#: A process left by a call: it maps ``m.bin`` shared (closing its descriptor), says
#: ``ready``, and once ``go`` appears stores into the mapping (no event, no close) and
#: says ``stored``; then it stays.
STORER = (
    "import mmap, os, time\n"
    "f = open('m.bin', 'r+b'); m = mmap.mmap(f.fileno(), 4); f.close()\n"
    "open('ready', 'w').close()\n"
    "while not os.path.exists('go'): time.sleep(0.02)\n"
    "m[0:4] = b'BBBB'\n"
    "open('stored', 'w').close()\n"
    "time.sleep(3600)\n"
)


def _host_files(root: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for p in Path(root).rglob("*"):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.mark.parametrize(
    ("backend", "host_scan"),
    [
        pytest.param("local", "1", id="local"),
        pytest.param("spacesd", "1", marks=pytest.mark.spacesd, id="spacesd-host-scan"),
        pytest.param("spacesd", "0", marks=pytest.mark.spacesd, id="spacesd-in-space"),
    ],
)
def test_stores_through_a_mapping_a_leftover_holds_reach_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, host_scan: str
) -> None:
    """Explicit transactional mode: a bash call leaves a process holding a shared
    mapping of ``m.bin``, which stores into it while a later call runs (no inotify
    event, no close). The call that left it says so in its result; every later scan
    reads the held file again, so the image follows the Space."""
    _needs(backend)
    monkeypatch.setenv("DS_HOST_SCAN", host_scan)
    storer = STORER.replace("'", "'\\''")
    calls: list[tuple[str, Any]] = [
        (
            "bash",
            {
                "command": f"printf aaaa > m.bin; nohup python3 -c '{storer}' > /dev/null 2>&1 "
                "< /dev/null & while [ ! -e ready ]; do sleep 0.02; done; echo started"
            },
        ),
        ("bash", {"command": "cat m.bin"}),
        ("bash", {"command": "touch go; while [ ! -e stored ]; do sleep 0.02; done"}),
        ("bash", {"command": "cat m.bin"}),
    ]

    async def go() -> None:
        async with wrapped_harness(tmp_path, backend, "transactional", calls) as (h, durable):
            conv, results = await run_call_list(h)
            assert [r["status"] for r in results] == ["ok"] * len(calls), results
            assert "left processes running in the workspace" in results[0]["content"]
            assert not any("left processes" in r["content"] for r in results[1:]), results
            assert results[3]["content"].startswith("BBBB"), results
            space = await durable.space(conv.id)
            files = _host_files(space.root)
            assert files["m.bin"] == b"BBBB"
            table = image_log.table(h, conv.id)
            assert set(table) == set(files)
            for path, entry in table.items():
                assert image_log.blob(h, conv.id, entry.sha256 or "") == files[path], path

    asyncio.run(go())


def test_auto_mode_says_why_it_leaves_for_checkpoints(tmp_path: Path) -> None:
    """Auto mode: a bash call that leaves a process in the workspace switches the
    conversation to checkpoints, and its result says so (the model reads it there)."""
    calls: list[tuple[str, Any]] = [
        ("bash", {"command": "nohup sleep 3600 > /dev/null 2>&1 < /dev/null & echo bg"}),
        ("bash", {"command": "echo next"}),
    ]

    async def go() -> None:
        async with wrapped_harness(tmp_path, "local", "auto", calls) as (h, _durable):
            _conv, results = await run_call_list(h)
            assert [r["status"] for r in results] == ["ok", "ok"], results
            assert "the Space is kept by checkpoints from now on" in results[0]["content"]
            assert "note" not in results[1]["content"], results

    asyncio.run(go())
