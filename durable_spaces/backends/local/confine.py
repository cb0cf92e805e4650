"""What keeps a command of a ``local`` Space in its epoch's cgroup: Landlock and seccomp.

Why: a cgroup cannot be left by a plain process, but a process of the same uid as the
hierarchy's owner (root, as commands often are) can move itself anywhere by writing its
pid into another cgroup's ``cgroup.procs``, or be born elsewhere with
``clone3(CLONE_INTO_CGROUP)`` given a descriptor of another cgroup's directory. A cgroup
namespace with cgroupfs mounted again in a mount namespace hides the host's hierarchy from
the paths a command sees, but root undoes both (``nsenter -t 1 -m -C``, a new mount, or
``/proc/<pid>/root`` of any host process), so that is not the fence here.

The fence, applied by each command's supervisor to itself just before it starts the
command (``supervisor.py``), so the command and all it starts inherit it for good:

- a Landlock domain that allows every write everywhere except beneath a cgroup file
  system (``cgroup`` or ``cgroup2``, wherever mounted): no ``cgroup.procs`` /
  ``cgroup.threads`` write, no ``mkdir`` of a sibling or nested cgroup, no v1
  ``release_agent``. Landlock also refuses, whatever the capabilities, a mount, and
  ptrace or ``/proc/<pid>/{root,ns,mem,environ,fd}`` of any process outside the domain:
  no way back to the host's mount or cgroup namespace, no other process made to move.
- a seccomp filter that answers ``clone3`` with ENOSYS (its flags sit behind a pointer a
  filter cannot read, so all of it; libc and language runtimes fall back to ``clone``,
  as under Docker's default profile): ``CLONE_INTO_CGROUP`` with an ``O_PATH`` descriptor,
  which Landlock does not check, is the one way into a cgroup that is not a file write.

Landlock grants by directory, never by exclusion, so the domain grants every write right
beneath each entry of ``/`` that holds no cgroup mount, and walks into those that do
(``/sys``, ``/sys/fs``, ...) until only the cgroup mounts are left out. What it costs a
command: it cannot write cgroupfs, mount, trace a process it did not start, nor create a
file directly in ``/`` or under a top-level directory made after the rules were built (a
fork server builds them once at its start: ``forkserver.py``). Reads are not restricted.

Stdlib only and free of package imports: the supervisor and the fork server load this
file by its path (``python -I -S``). The syscalls have no wrapper in Python's standard
library; a binding from PyPI could not be imported under ``-I -S``.
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False  # not ``typing``'s: a supervisor that imports typing starts slower
if TYPE_CHECKING:
    from typing import Any

# Syscall numbers of the unified table (the same on x86_64 and aarch64, the machines this
# file knows; another machine reports the fence unavailable).
_MACHINES = ("x86_64", "aarch64")
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CLONE3 = 435
_X32_BIT = 0x40000000  # x32 ABI syscalls on x86_64: the same number with this bit
_RULE_PATH_BENEATH = 1
_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_EPERM, _EACCES, _ENOSYS = 1, 13, 38

# Landlock's filesystem rights: WRITE_FILE (1), REMOVE_DIR .. MAKE_SYM (4-12), REFER (13,
# ABI 2), TRUNCATE (14, ABI 3). Reads and execution are not handled: always allowed.
_WRITE_FILE, _TRUNCATE = 1 << 1, 1 << 14
_MAKE_AND_REMOVE = sum(1 << i for i in range(4, 13))
_REFER = 1 << 13
#: Landlock ABI needed: 2 (REFER: without it every rename across directories is refused).
MIN_ABI = 2
#: More rules than this (a cgroup mount inside a crowded directory): not built.
MAX_RULES = 1024
_CGROUPFS = ("cgroup", "cgroup2")


class CgroupFence:
    """A Landlock ruleset (an open descriptor) and a seccomp program, built once, applied by
    each process to confine (``apply``)."""

    def __init__(self, ruleset_fd: int, program: Any, libc: Any, rules: int) -> None:
        self.ruleset_fd = ruleset_fd
        self.rules = rules
        self._program = program  # kept alive: ``_fprog`` points into it
        self._fprog = _fprog(program)
        self._libc = libc

    def apply(self) -> None:
        """Confine this process and everything it starts from now on (OSError: it could
        not be; then run nothing)."""
        self.deny_clone3()
        self.restrict()

    def deny_clone3(self) -> None:
        """The seccomp half alone. Attaching a filter compiles it (the kernel's BPF JIT:
        milliseconds on a virtual machine), so a fork server takes it once, for itself,
        and its children inherit it (``forkserver.py``)."""
        libc = self._libc
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._fprog, 0, 0) != 0:
            if _errno() != _EACCES:
                raise _error("seccomp")
            # Without CAP_SYS_ADMIN both need no_new_privs (setuid programs stop raising).
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise _error("no_new_privs")
            if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._fprog, 0, 0) != 0:
                raise _error("seccomp")

    def restrict(self) -> None:
        """The Landlock half alone: a domain of its own for this process (so a command
        cannot trace its fork server, nor one command another)."""
        libc = self._libc
        if libc.syscall(_RESTRICT_SELF, self.ruleset_fd, 0) != 0:
            if _errno() != _EPERM or libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise _error("landlock_restrict_self")
            if libc.syscall(_RESTRICT_SELF, self.ruleset_fd, 0) != 0:
                raise _error("landlock_restrict_self")

    def close(self) -> None:
        os.close(self.ruleset_fd)


def _errno() -> int:
    import ctypes

    return int(ctypes.get_errno())


def _error(what: str) -> OSError:
    e = _errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _libc() -> Any:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes come as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def cgroup_mounts(mountinfo: str) -> list[str]:
    """Every mount point of a cgroup file system (v1 or v2) in ``mountinfo``'s text."""
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        parts = left.split()
        if right.split()[:1] and right.split()[0] in _CGROUPFS and len(parts) >= 5:
            out.append(os.path.normpath(_unescape(parts[4])))
    return out


def granted(blocked: list[str], top: str = "/") -> list[str]:
    """The paths beneath which every write is allowed: each entry of ``top`` with no
    ``blocked`` path at or below it, walking into those with one (symlinks are left out:
    what they point at is granted or not where it is)."""
    if not blocked:
        return [top]
    out: list[str] = []

    def walk(d: str) -> None:
        try:
            names = os.listdir(d)
        except OSError:
            return  # unreadable: nothing beneath it is granted
        for name in sorted(names):
            p = os.path.join(d, name)
            if p in blocked or os.path.islink(p):
                continue
            if any(b.startswith(p + "/") for b in blocked):
                walk(p)
            else:
                out.append(p)
            if len(out) > MAX_RULES:
                raise OSError(0, f"more than {MAX_RULES} entries beside the cgroup mounts")

    if top in blocked:
        return []
    walk(top)
    return out


def _seccomp_program() -> Any:
    """``clone3`` (any ABI of the machine) -> ENOSYS; everything else allowed."""
    import ctypes

    code = [
        (0x20, 0, 0, 0),  # A = seccomp_data.nr
        (0x54, 0, 0, 0xFFFFFFFF ^ _X32_BIT),  # A &= ~x32 bit
        (0x15, 0, 1, _CLONE3),  # A == clone3 ? next : skip one
        (0x06, 0, 0, 0x00050000 | _ENOSYS),  # SECCOMP_RET_ERRNO | ENOSYS
        (0x06, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
    ]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in code)
    buf = ctypes.create_string_buffer(raw, len(raw))
    return (len(code), buf)


def _fprog(program: Any) -> Any:
    import ctypes

    n, buf = program
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxP", n, ctypes.addressof(buf)))
    return fprog


def build(mountinfo_path: str = "/proc/self/mountinfo") -> CgroupFence:
    """The fence for this host as its mounts are now (OSError: it cannot be built, why)."""
    import ctypes

    machine = os.uname().machine
    if machine not in _MACHINES:
        raise OSError(0, f"the fence knows the syscalls of {', '.join(_MACHINES)}, not {machine}")
    libc = _libc()
    abi = libc.syscall(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    if abi < 0:
        e = _errno()
        raise OSError(e, f"no Landlock in this kernel ({os.strerror(e)})")
    if abi < MIN_ABI:
        raise OSError(0, f"Landlock ABI {abi}, {MIN_ABI} needed (Linux 5.19+)")
    rights = _WRITE_FILE | _MAKE_AND_REMOVE | _REFER | (_TRUNCATE if abi >= 3 else 0)
    file_rights = rights & (_WRITE_FILE | _TRUNCATE)
    with open(mountinfo_path) as f:
        blocked = cgroup_mounts(f.read())
    paths = granted(blocked)
    attr = ctypes.create_string_buffer(struct.pack("QQQ", rights, 0, 0), 24)
    size = 8 if abi < 4 else 16  # handled_access_fs; handled_access_net from ABI 4
    ruleset = libc.syscall(_CREATE_RULESET, attr, size, 0)
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        for p in paths:
            try:
                fd = os.open(p, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue  # gone since the walk: nothing to grant
            try:
                allowed = rights if os.path.isdir(p) else file_rights
                rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
                if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) != 0:
                    continue  # a kind of file Landlock takes no rule for: not granted
            finally:
                os.close(fd)
        os.set_inheritable(ruleset, False)
    except BaseException:
        os.close(ruleset)
        raise
    return CgroupFence(ruleset, _seccomp_program(), libc, len(paths))


_why: list[str | None] = []


def unavailable() -> str | None:
    """None when this host can build the fence; else why not, in one line (once per
    process: the answer is a property of the kernel)."""
    if not _why:
        try:
            build().close()
            _why.append(None)
        except OSError as e:
            _why.append(f"commands could leave their epoch's cgroup: {e.strerror or e}")
    return _why[0]
