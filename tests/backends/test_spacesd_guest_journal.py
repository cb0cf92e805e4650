"""The change journal in the Space (``backends/spacesd/guest_journal.py`` and its helper
``guest_journal.pl``), on the real cua-spacesd with the host scan off (``DS_HOST_SCAN=0``),
as a microvm's Space runs it: each scan it answers must be the table the daemon's own
scan (``find`` and ``sha256sum``, the journal off) finds, after every kind of change a
command can make, including those inotify sees only per inode (a write through a hard
link outside the workspace, a store through a shared mapping); and whatever it cannot
vouch for (its helper killed, an answer that is not one, too many watches, a new epoch)
makes the scan the daemon's own, or a new helper's full walk, never a wrong table.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import random
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_spaces.backends.spacesd import guest_journal as gj
from durable_spaces.backends.spacesd.backend import SpacesdBackend
from durable_spaces.backends.spacesd.spacesd_space import SpacesdSpace
from durable_spaces.chaos import mutants
from durable_spaces.chaos.journal_kill import kill_journal
from durable_spaces.errors import SpaceGoneError
from durable_spaces.settings import Settings
from durable_spaces.space import PathTable

pytestmark = [
    pytest.mark.spacesd,
    pytest.mark.skipif(
        not Settings.from_env().space_journal, reason="DS_SPACE_JOURNAL=0 turns it off"
    ),
]

EPOCH = 1


@pytest.fixture
async def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SpacesdBackend]:
    monkeypatch.setenv("DS_HOST_SCAN", "0")
    b = SpacesdBackend(tmp_path / "spaces")
    yield b
    for name in await b.names():
        await b.delete(name)
    await b.close()


@pytest.fixture
async def space(backend: SpacesdBackend) -> SpacesdSpace:
    s = await backend.create("gj")
    await s.advance_epoch(EPOCH)
    await sh(s, "mkdir -p d/e && printf alpha > a && printf beta > d/b && printf c > d/e/c")
    return s  # type: ignore[return-value]


async def sh(space: SpacesdSpace, script: str) -> None:
    r = await space.exec(["sh", "-c", script], key=None, epoch=EPOCH)
    assert r.exit_code == 0, r.output


async def oracle(space: SpacesdSpace) -> PathTable:
    """The daemon's own scan of the same Space (a new object: no cache, no journal)."""
    other = SpacesdSpace(
        space.name, space.root, space.instance_id, space._url, space._token, space._probe,
        user=space._user, sdk_home=space._sdk_home,
    )  # fmt: skip
    other._guest.unavailable = "the oracle scans without a journal"
    try:
        return await other.scan()
    finally:
        await other.close()


def count_commands(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The argv of every command a Space starts from now on (``spawn``)."""
    runs: list[object] = []
    real = SpacesdSpace.spawn

    async def counted(self: SpacesdSpace, argv: object, **kw: object) -> object:
        runs.append(argv)
        return await real(self, argv, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(SpacesdSpace, "spawn", counted)
    return runs


def journaled(space: SpacesdSpace) -> int:
    return space.scan_stats["guest_journal"]


#: Changes a command can make, each followed by a scan the journal must answer.
STEPS = [
    "printf more >> a",
    "printf new > d/new && mkdir -p n/m && printf q > n/m/q",
    "mv n moved",
    "rm -rf d/e",
    "chmod 700 a",
    "ln -s a link && ln -s /etc/passwd out",
    "ln moved/m/q /tmp/gj-hl && printf through-link >> /tmp/gj-hl && rm /tmp/gj-hl",
    'perl -e \'open(my $f, "+<", "a"); truncate($f, 3)\'',
    "python3 -c \"import mmap; f=open('d/b','r+b'); m=mmap.mmap(f.fileno(), 0);"
    " m[0:1]=b'B'; m.close(); f.close()\"",
    "rm link && mkdir link && printf in > link/f",
    "rm -rf link && printf file > link",
    "mkdir -p deep/1/2 && printf x > deep/1/2/f && mv deep/1 top",
    "printf 'a\\\\b' > 'back\\\\slash'",
    "head -c 70000 /dev/urandom > big",
    "printf nl > \"$(printf 'new\\nline')\" && printf raw > \"$(printf 'bad\\377name')\"",
    "mv \"$(printf 'new\\nline')\" \"$(printf 'bad\\377name')\"",
    "mkfifo fifo && ln -s missing dangling",
    "true",
]


async def test_every_change_is_the_daemon_scans_table(space: SpacesdSpace) -> None:
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_full"] == 1
    for i, step in enumerate(STEPS, 1):
        await sh(space, step)
        table = await space.scan()
        assert table == await oracle(space), step
        assert journaled(space) == i, (step, space._guest.why_full)
    assert space.scan_stats["guest_full"] == 1  # one walk, every later scan the journal's


async def test_random_changes_match_the_daemon_scan(space: SpacesdSpace) -> None:
    rnd = random.Random(1313)
    names = ["a", "b", "a/b", "b/c", "a/b/c", "c"]
    ops = [
        "mkdir -p {d}", "printf {r} > {d}/{f}", "printf {r} >> {f}", "rm -rf {d}",
        "mv {d} {d2}", "mv {f} {d}/{f2}", "ln -sf {f} {f2}", "chmod {m} {f}", "rm -f {f}",
        "cp -r {d} {d2}", "touch {d}/{f}", "ln {f} {f2}", "rm -rf {d2} && mkdir {d2}",
        "mkdir -p {d}/{d2} && printf x > {d}/{d2}/{f}", "head -c {n} /dev/urandom > {f}",
    ]  # fmt: skip
    await space.scan()
    for _ in range(30):
        script = "; ".join(
            rnd.choice(ops).format(
                d=rnd.choice(names),
                d2=rnd.choice(names),
                f=rnd.choice(names),
                f2=rnd.choice(names),
                r=rnd.randrange(10**6),
                m=rnd.choice(["600", "755"]),
                n=rnd.choice([5, 70000]),
            )
            for _ in range(rnd.randint(1, 4))
        )
        await sh(space, f"({script}) 2>/dev/null; true")
        assert await space.scan() == await oracle(space), script
    assert space.scan_stats["guest_full"] == 1


async def test_a_journal_that_misses_content_events_is_caught_by_the_comparison(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above can fail: with ``journal_miss`` the helper drops the events
    of a file's contents, and an append goes unseen."""
    monkeypatch.setattr(mutants, "_active", frozenset({"journal_miss"}))
    await space.scan()
    await sh(space, "printf more >> a")
    table = await space.scan()
    assert table["a"] != (await oracle(space))["a"]


async def test_read_files_of_what_changed_runs_no_command(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    await space.scan()
    await sh(space, "printf one > x && printf two > d/y")
    await space.scan()
    runs = count_commands(monkeypatch)
    assert await space.read_files(["x", "d/y"]) == {"x": b"one", "d/y": b"two"}
    assert runs == []


async def test_a_killed_helper_makes_the_next_scan_the_daemons_then_a_new_walk(
    space: SpacesdSpace,
) -> None:
    await space.scan()
    await sh(space, "printf changed > a")
    signal_helpers(space, signal.SIGKILL)
    assert await space.scan() == await oracle(space)  # the daemon's scan: the helper is gone
    assert space._guest.why_full  # dropped: it exited (or its stdin was gone)
    fulls = space.scan_stats["guest_full"]
    await sh(space, "printf again > a")
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_full"] == fulls + 1  # a new helper, a new walk


async def test_a_new_epoch_starts_a_new_helper(space: SpacesdSpace) -> None:
    await space.scan()
    await space.advance_epoch(EPOCH + 1)
    assert space._guest.why_full == "a new epoch"
    r = await space.exec(["sh", "-c", "printf later >> a"], key=None, epoch=EPOCH + 1)
    assert r.exit_code == 0
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_full"] == 2


@pytest.mark.parametrize(
    "script",
    [
        pytest.param("exit 3", id="exits"),
        pytest.param('$|=1; while (<STDIN>) { print "Z\\0\\0\\0\\0" }', id="unknown-frame"),
        pytest.param('$|=1; while (<STDIN>) { print "F\\xff\\xff\\xff\\xff" }', id="huge-frame"),
        pytest.param(
            '$|=1; while (<STDIN>) { print "E", pack("N", 13), pack("N/a* N/a*", "nonce", "") }',
            id="another-nonce",
        ),
        pytest.param(
            '$|=1; while (<STDIN>) { print "E", pack("N", 3), "abc" }',
            id="cut-short",
        ),
        pytest.param(
            '$|=1; while (my $n = <STDIN>) { chomp $n; my $b = pack("N/a* N Q> c N/a*", '
            '"../escape", 420, 1, 1, "x"); print "F", pack("N", length $b), $b, "E", '
            'pack("N", 8 + length $n), pack("N/a* N/a*", $n, "") }',
            id="escaping-path",
        ),
    ],
)
async def test_a_helper_that_gives_no_answer_leaves_the_scan_to_the_daemon(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    monkeypatch.setattr(gj, "SCRIPT", script)
    for _ in range(3):
        assert await space.scan() == await oracle(space)
        await sh(space, "printf x >> a")
    assert space.scan_stats["guest_journal"] == space.scan_stats["guest_full"] == 0
    assert space._guest.unavailable is not None  # given up after GIVE_UP helpers


async def test_too_many_watches_is_untrusted_and_the_scan_still_right(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gj, "MAX_WATCHES", 3)
    assert await space.scan() == await oracle(space)
    assert "more than 3 watches" in space._guest.why_full


async def test_the_helper_reads_the_machines_boot_id_and_only_while_it_runs(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``machine_boot_id``: the kernel's, read by the running helper (no command once it
    runs; the first read starts it, and its first scan is still a walk); None once it is
    gone, so the adapter reads it by a command."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        kernel = f.read().strip()
    assert await space.machine_boot_id() == kernel
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_full"] == 1 and space.scan_stats["guest_journal"] == 0
    with monkeypatch.context() as m:
        runs = count_commands(m)
        assert await space.machine_boot_id() == kernel
        assert runs == []
    signal_helpers(space, signal.SIGKILL)
    assert await space.machine_boot_id() is None
    assert space._guest.entries == {}  # dropped: the next scan is a new walk


@pytest.mark.parametrize(
    "boot",
    [
        pytest.param("", id="empty"),
        pytest.param("x" * 65, id="long"),
        pytest.param("a\\nb", id="newline"),
    ],
)
async def test_a_boot_id_that_is_not_one_is_not_believed(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch, boot: str
) -> None:
    script = gj.SCRIPT.replace("'/proc/sys/kernel/random/boot_id'", "'/dev/null'")
    script = script.replace("my $id = $bf ? <$bf> : undef;", f'my $id = "{boot}";')
    assert script != gj.SCRIPT
    monkeypatch.setattr(gj, "SCRIPT", script)
    await space.scan()
    assert await space.machine_boot_id() is None
    assert "boot id" in space._guest.why_full


def helpers(space: SpacesdSpace) -> list[int]:
    """The journal helpers running for this Space's workspace (the daemon is on this
    host: its commands are this host's processes)."""
    import psutil

    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        mine = cmd[:2] == ["perl", "-e"] and cmd[3:4] == [space.root]
        if mine and proc.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(proc.pid)
    return out


def signal_helpers(space: SpacesdSpace, sig: signal.Signals) -> None:
    """Signal this Space's helpers only (a ``pkill`` in a Space without a PID namespace
    would reach every helper on this host, other tests' too)."""
    pids = helpers(space)
    assert pids
    for pid in pids:
        os.kill(pid, sig)
    if sig == signal.SIGKILL:
        for _ in range(200):
            if not helpers(space):
                return
            time.sleep(0.01)


async def test_the_labs_journal_kill_ends_this_spaces_helper_only(
    space: SpacesdSpace, backend: SpacesdBackend
) -> None:
    """``kill_journal`` (the lab's ``journal_kill``, a command in the Space): the Space's
    helper dies, another Space's does not; the next scan finds it gone and is right (the
    daemon's), and the one after is a new helper's walk. Nothing to kill is 0."""
    other: SpacesdSpace = await backend.create("gj-other")  # type: ignore[assignment]
    await other.advance_epoch(EPOCH)
    await other.scan()
    await space.scan()
    assert len(helpers(space)) == 1 and len(helpers(other)) == 1
    assert await kill_journal(space) == 1
    for _ in range(200):
        if not helpers(space):
            break
        await asyncio.sleep(0.01)
    assert helpers(space) == [] and len(helpers(other)) == 1
    assert await kill_journal(space) == 0
    await sh(space, "printf while-dead >> a")
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_journal"] == 0, space._guest.why_full  # not the journal's
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_full"] == 2


def sentinel_dir(pid: int) -> Path:
    """The directory of the sentinel a helper holds open (its lock, sweep_sentinels)."""
    import psutil

    [path] = [f.path for f in psutil.Process(pid).open_files() if "/.ds-journal-" in f.path]
    return Path(path).parent


async def test_a_new_helper_removes_what_killed_helpers_left(
    space: SpacesdSpace, backend: SpacesdBackend
) -> None:
    """A helper killed with its epoch or its machine leaves its sentinel's directory in
    /tmp; the next helper removes those whose sentinel nobody holds locked (a live
    helper's stays, another workspace's included, and so does a directory younger than a
    helper's start)."""
    live: SpacesdSpace = await backend.create("gj-live")  # type: ignore[assignment]
    await live.advance_epoch(EPOCH)
    await live.scan()
    [live_pid] = helpers(live)
    live_dir = sentinel_dir(live_pid)
    await space.scan()
    [pid] = helpers(space)
    dead = sentinel_dir(pid)
    assert dead.is_dir()
    signal_helpers(space, signal.SIGKILL)
    assert dead.is_dir()  # SIGKILL: its END block did not run
    base = dead.parent
    made = {}
    for kind in ("locked", "unlocked", "empty", "young"):
        d = base / f".ds-journal-{os.getpid()}-{abs(hash((kind, time.time()))) % 10**9}"
        d.mkdir(mode=0o700)
        if kind != "empty":
            (d / "sentinel").touch()
        made[kind] = d
    lock = open(made["locked"] / "sentinel")  # noqa: SIM115 - held across the scan
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        old = time.time() - 120
        for d in (dead, made["locked"], made["unlocked"], made["empty"], live_dir):
            os.utime(d, (old, old))
        await space.advance_epoch(EPOCH + 1)
        assert await space.scan() == await oracle(space)  # a new helper: it swept
        assert not dead.exists() and not made["unlocked"].exists()
        assert not made["empty"].exists()
        assert made["locked"].is_dir() and made["young"].is_dir()
        [new] = helpers(space)
        assert sentinel_dir(new).is_dir()  # its own is not swept
        assert live_dir.is_dir()  # nor a live helper's
        assert await live.scan() == await oracle(live)
        assert live.scan_stats["guest_journal"] == 1  # and that helper still answers
    finally:
        lock.close()
        for d in made.values():
            shutil.rmtree(d, ignore_errors=True)


async def test_a_new_helper_ends_an_older_one_of_the_same_workspace(space: SpacesdSpace) -> None:
    """One helper per workspace: the one a machine restored from a checkpoint brings back
    answers nobody. Two objects of one Space take turns: each new helper ends the other's,
    and each object's next scan is right (a new walk)."""
    other = SpacesdSpace(
        space.name, space.root, space.instance_id, space._url, space._token, space._probe,
        user=space._user, sdk_home=space._sdk_home,
    )  # fmt: skip
    try:
        for turn, obj in enumerate([space, other, space, other]):
            await sh(space, f"printf {turn} >> a")
            assert await obj.scan() == await oracle(space), turn
            assert len(helpers(space)) == 1, turn
    finally:
        await other.close()
    await space.close()
    for _ in range(100):
        if not helpers(space):
            break
        await asyncio.sleep(0.05)
    assert helpers(space) == []  # closed: the helper read the end of its input and left


@pytest.mark.parametrize("fault", ["delete", "restart", "kill_daemon"])
async def test_a_daemon_gone_under_the_helper_costs_no_wait(
    space: SpacesdSpace, backend: SpacesdBackend, fault: str
) -> None:
    """The SDK retries a dead daemon's connection for ~12 s before a write to the helper
    fails: a scan whose Space was removed or restarted under it (by another process, so
    this object keeps its connection) gives up on the helper as soon as the backend's
    probe says its daemon is another, and is the daemon's own (or says the Space is
    gone) within a few seconds."""
    await space.scan()
    lab = SpacesdBackend(backend.state_dir)  # another process's view: no shared objects
    await getattr(lab, fault)(space.name)
    if fault == "delete":
        with pytest.raises(SpaceGoneError):
            await space.scan()
    else:
        assert await space.scan() == await oracle(space)
    # What ended the wait on the helper: the backend's look at its daemon (removed) or the
    # new daemon's own answer (restarted, killed), never the SDK's retries of the dead
    # one's connection (they end in a transport error; with DAEMON_LOOK_S past them, a
    # removal's scan ends so).
    why = space._guest.why_full
    assert "transport error" not in why, why
    if fault == "delete":
        assert "the daemon the journal's helper ran under is gone" in why, why
    await lab.close()


async def test_a_stopped_helper_costs_a_silence_not_a_hang(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper stopped (SIGSTOP: a paused Space, or a command of its user) answers
    nothing: the scan gives up after ``SILENCE_TIMEOUT`` of silence and is the daemon's
    own; the next one starts a helper, which ends the stopped one."""
    monkeypatch.setattr(gj, "SILENCE_TIMEOUT", 1.0)
    await space.scan()
    await sh(space, "printf x >> a")
    signal_helpers(space, signal.SIGSTOP)
    # the event: the scan gave up on the silent helper (not a duration, which load stretches)
    assert await space.scan() == await oracle(space)
    assert "said nothing" in space._guest.why_full
    monkeypatch.setattr(gj, "SILENCE_TIMEOUT", 20.0)  # a loaded machine starts perl slowly
    await sh(space, "printf y >> a")
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_full"] == 2
    assert len(helpers(space)) == 1  # the stopped one was ended by the new one


async def test_a_long_walk_speaks_while_it_works(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Silence, not time, ends a wait: a walk that takes longer than the silence allowed
    (1500 files, 4 ms each: 6 s against 3) is not given up, since the helper says it is
    still working (at least once a second)."""
    await sh(space, "mkdir -p many && cd many && for i in $(seq 1500); do : > f$i; done")
    look = "    look($rel, $path, $st[2]);"
    script = gj.SCRIPT.replace(look, "    select(undef, undef, undef, 0.004);" + look)
    assert script != gj.SCRIPT
    monkeypatch.setattr(gj, "SCRIPT", script)
    assert await space.machine_boot_id() is not None  # started (perl's start is no walk)
    monkeypatch.setattr(gj, "SILENCE_TIMEOUT", 3.0)
    table = await space.scan()
    assert space.scan_stats["guest_full"] == 1, space._guest.why_full
    assert table == await oracle(space)


async def test_a_mount_inside_the_workspace_is_refused_by_the_same_helper_until_it_goes(
    space: SpacesdSpace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mount at or under the workspace, made before or after the helper started: every
    scan is the daemon's own while it is there, the helper stays (no new one a scan, and
    it still reads the boot id), and the first scan after it goes is a new walk."""
    from durable_spaces.backends.spacesd.daemon import unshare_reason

    if (why := unshare_reason()) is not None:  # the mount must stay in the Space
        pytest.skip(f"no namespaces for the Space (its mounts would be this host's): {why}")
    await sh(space, "mkdir -p mnt && mount -t tmpfs tmpfs mnt && printf t > mnt/t")
    assert await space.scan() == await oracle(space)  # a new helper: the mount was there
    [helper] = helpers(space)
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert await space.machine_boot_id() == f.read().strip()
    for step in ("printf u > mnt/u", "printf a2 >> a"):
        await sh(space, step)
        assert await space.scan() == await oracle(space)
        assert "inside the workspace" in space._guest.why_full
    assert helpers(space) == [helper]
    assert space.scan_stats["guest_full"] == 0 and space.scan_stats["guest_journal"] == 0
    await sh(space, "umount mnt && printf after > mnt/x")
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_full"] == 1  # a new walk, by the same helper
    await sh(space, "printf y >> mnt/x")
    assert await space.scan() == await oracle(space)
    assert space.scan_stats["guest_journal"] == 1 and helpers(space) == [helper]
