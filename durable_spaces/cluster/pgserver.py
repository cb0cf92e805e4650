"""A private PostgreSQL server in a temp dir, for tests, CI and a one-machine lab.

Debian's own binaries (``initdb``, ``pg_ctl``) run it; nothing is downloaded. Guarantees:

- Everything it makes lives in one directory (data, socket, log), mode 0700, removed by
  ``close()`` (and at interpreter exit if a caller forgot).
- It listens on a unix socket in that directory; with ``tcp=True`` also on 127.0.0.1 only,
  where a password generated here is required (the socket trusts whoever can reach it,
  and only root and the server's user can).
- As root it still works: PostgreSQL refuses to run as root, so ``initdb`` and
  ``pg_ctl`` run as an unprivileged user (``postgres``, else ``nobody``) that owns the
  directory, through ``runuser`` (or ``setpriv``).
- ``stop()`` / ``start()`` / ``crash()`` keep the data dir, so a test can restart the
  database under running clients. With ``durable=False`` (the default) ``fsync`` is off:
  a commit is still written to the OS before it returns, so it survives a server crash
  (``pg_ctl -m immediate``), not a crash of the machine.
- Bind parameters never reach the server log (``log_parameter_max_length*`` = 0), so a
  Space token a client sends is not written there even when its statement fails.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import LiteralString
from urllib.parse import quote

from durable_spaces.errors import ConfigError, DatabaseServerError
from durable_spaces.host.ports import free_port
from durable_spaces.settings import Settings


def _wait_gone(pid: int, timeout_s: float) -> None:
    """Until ``pid`` has exited: ``pg_ctl stop -w`` returns once the postmaster removed its
    pid file, which it does on its way out, a moment before it has exited (a caller that
    starts again or checks for the process at once raced it; a loaded CI machine showed
    it). A zombie counts as gone: its parent, not this server, is yet to reap it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except (OSError, IndexError):
            return
        time.sleep(0.01)


SUPERUSER = "postgres"
_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_CANDIDATE_USERS = ("postgres", "nobody")


def _version_key(bindir: str) -> tuple[int, ...]:
    m = re.search(r"/postgresql/([\d.]+)/bin$", bindir)
    return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)


def find_binaries(bindir: Path | None = None) -> tuple[str, str] | None:
    """``(initdb, pg_ctl)``: in ``bindir`` (``Settings.pg_bindir``: ``DS_PG_BINDIR``),
    else the newest ``/usr/lib/postgresql/*/bin``, else ``PATH``; None when either is
    missing."""
    dirs = [str(bindir)] if bindir is not None else []
    dirs += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    for d in dirs:
        initdb, pg_ctl = os.path.join(d, "initdb"), os.path.join(d, "pg_ctl")
        if os.access(initdb, os.X_OK) and os.access(pg_ctl, os.X_OK):
            return initdb, pg_ctl
    found = shutil.which("initdb"), shutil.which("pg_ctl")
    return (found[0], found[1]) if found[0] and found[1] else None


def _run_as() -> str | None:
    """The unprivileged user to run the server as when we are root (None when not root)."""
    if os.geteuid() != 0:
        return None
    for name in _CANDIDATE_USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise DatabaseServerError(
        f"running as root and none of the users {', '.join(_CANDIDATE_USERS)} exists "
        "to run PostgreSQL as (it refuses root)"
    )


def unavailable_reason(settings: Settings | None = None) -> str | None:
    """Why a private PostgreSQL cannot run here, or None (tests skip with this);
    ``settings`` read from the environment when not given."""
    if find_binaries((Settings.from_env() if settings is None else settings).pg_bindir) is None:
        return (
            "PostgreSQL server binaries (initdb, pg_ctl) not found under "
            "/usr/lib/postgresql/*/bin or on PATH: install Debian's postgresql "
            "(images/postgres/ci-setup.sh)"
        )
    if os.geteuid() == 0:
        try:
            _run_as()
        except DatabaseServerError as e:
            return str(e)
        if not (shutil.which("runuser") or shutil.which("setpriv")):
            return "running as root and neither runuser nor setpriv is installed"
    return None


def _cleanup(base: Path, argv_stop: list[str], remove: bool) -> None:
    """Finalizer: stop a server still running; remove the directory if we made it."""
    if (base / "data" / "postmaster.pid").exists():
        subprocess.run(argv_stop, cwd=base, capture_output=True, timeout=60, check=False)
    if remove:
        shutil.rmtree(base, ignore_errors=True)


class PgServer:
    """One private PostgreSQL cluster. ``with PgServer() as pg: connect(pg.url())``."""

    def __init__(
        self,
        base_dir: str | Path | None = None,
        *,
        tcp: bool = False,
        durable: bool = False,
        user: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        """``settings``: the product's (``DS_PG_BINDIR``), read now when not given."""
        settings = Settings.from_env() if settings is None else settings
        bins = find_binaries(settings.pg_bindir)
        if bins is None:
            raise DatabaseServerError(unavailable_reason(settings) or "PostgreSQL binaries missing")
        self._initdb, self._pg_ctl = bins
        self.tcp = tcp
        self.durable = durable
        self.user = user if user is not None else _run_as()
        made = base_dir is None
        if base_dir is None:
            # Not under the caller's tmp dir: pytest's is 0700 root, which the server's
            # user could not traverse. /tmp is world-traversable.
            self.base = Path(tempfile.mkdtemp(prefix="ds-pg-"))
        else:
            self.base = Path(base_dir)
            self.base.mkdir(parents=True, exist_ok=True)
        if len(str(self.base)) > 80:  # the socket path must fit sockaddr_un (107 bytes)
            raise ConfigError(f"PgServer base_dir {self.base} is too long for a unix socket")
        self.port = free_port() if tcp else 5432  # without tcp it only names the socket
        self._initialised = (self.data_dir / "PG_VERSION").exists()
        self._password = self._load_password() if tcp else ""
        stop = self._cmd(self._ctl("stop", "-m", "immediate"))
        self._finalizer = weakref.finalize(self, _cleanup, self.base, stop, made)

    def __repr__(self) -> str:  # no password
        return f"PgServer(base={str(self.base)!r}, port={self.port}, tcp={self.tcp})"

    # -- paths and URLs ------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def log_path(self) -> Path:
        return self.base / "server.log"

    def url(self, dbname: str = SUPERUSER, *, tcp: bool = False) -> str:
        """A libpq URL for ``dbname``: over the socket (trusted), or with ``tcp=True``
        over 127.0.0.1 with the password (the URL is then a secret: do not log it)."""
        if tcp:
            if not self.tcp:
                raise ConfigError("this PgServer was started without tcp=True")
            return f"postgresql://{SUPERUSER}:{self._password}@127.0.0.1:{self.port}/{dbname}"
        return f"postgresql://{SUPERUSER}@/{dbname}?host={quote(str(self.base), safe='')}" + (
            f"&port={self.port}"
        )

    # -- life cycle ----------------------------------------------------------------------

    def __enter__(self) -> PgServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def init(self) -> None:
        """``initdb`` once (a no-op for a data dir that is already initialised)."""
        if self._initialised:
            return
        self._own(self.base)
        argv = [self._initdb, "-D", str(self.data_dir), "-U", SUPERUSER, "-E", "UTF8"]
        argv += ["--locale=C", "--no-sync"]
        if self.tcp:
            pwfile = self.base / ".pw"
            pwfile.write_text(self._password + "\n")
            self._own(pwfile)
            argv += ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        else:
            argv += ["--auth=trust"]
        try:
            self._exec(argv, "initdb")
        finally:
            (self.base / ".pw").unlink(missing_ok=True)
        with open(self.data_dir / "postgresql.conf", "a") as f:
            f.write(self._conf())
        self._initialised = True

    def start(self) -> None:
        """Start (initialising first if needed); returns once it accepts connections."""
        self.init()
        if self.running():
            return
        # Where it listens is given at each start, so a data dir opened again by a new
        # PgServer (another port) agrees with its URL.
        listen = shlex.quote("127.0.0.1" if self.tcp else "")  # pg_ctl -o goes via sh
        opts = f"-c port={self.port} -c listen_addresses={listen}"
        opts += f" -c unix_socket_directories={shlex.quote(str(self.base))}"
        argv = self._ctl("start", "-w", "-t", "60", "-l", str(self.log_path), "-o", opts)
        self._exec(argv, "pg_ctl start")

    def stop(self, mode: str = "fast") -> None:
        """Stop, keeping the data dir: ``fast`` (roll back open transactions, checkpoint),
        ``immediate`` (no checkpoint: recovery replays the WAL on the next start)."""
        if mode not in ("smart", "fast", "immediate"):
            raise ConfigError(f"pg_ctl stop mode {mode!r}: use smart, fast or immediate")
        if self.running():
            pid = self._postmaster_pid()
            self._exec(self._ctl("stop", "-w", "-t", "60", "-m", mode), "pg_ctl stop")
            if pid is not None:
                _wait_gone(pid, 30.0)

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def crash(self) -> None:
        """Stop as a crash would (``pg_ctl stop -m immediate``)."""
        self.stop("immediate")

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        if not self._initialised:
            return False
        r = subprocess.run(
            self._cmd(self._ctl("status")), cwd=self.base, capture_output=True, timeout=30
        )
        return r.returncode == 0

    def close(self) -> None:
        """Stop the server; remove its directory unless the caller gave ``base_dir``."""
        self._finalizer()

    # -- databases -----------------------------------------------------------------------

    def create_database(self, name: str) -> str:
        """A new empty database; its URL (over the socket)."""
        self._admin("CREATE DATABASE {}", name)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", name)

    def _admin(self, template: LiteralString, name: str) -> None:
        if not _DB_NAME.match(name):
            raise ConfigError(f"database name {name!r}: use [a-z_][a-z0-9_]*, at most 63")
        import psycopg  # only these helpers need the client library
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(template).format(sql.Identifier(name)))

    # -- pieces --------------------------------------------------------------------------

    def _conf(self) -> str:
        lines = {
            "max_connections": "60",
            "shared_buffers": "16MB",
            "log_min_messages": "warning",
            "log_parameter_max_length": "0",
            "log_parameter_max_length_on_error": "0",
        }
        if not self.durable:
            lines.update(fsync="off", full_page_writes="off")
        body = "".join(f"{k} = {v}\n" for k, v in lines.items())
        return "\n# durable_spaces.cluster.pgserver\n" + body

    def _ctl(self, command: str, *args: str) -> list[str]:
        return [self._pg_ctl, command, "-D", str(self.data_dir), "-s", *args]

    def _cmd(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as the server's user (PostgreSQL refuses to run as root)."""
        if self.user is None:
            return list(argv)
        runuser, setpriv = shutil.which("runuser"), shutil.which("setpriv")
        if runuser:
            return [runuser, "-u", self.user, "--", *argv]
        if setpriv:
            pw = pwd.getpwnam(self.user)
            ids = [f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups"]
            return [setpriv, *ids, *argv]
        raise DatabaseServerError("running as root without runuser or setpriv")

    def _load_password(self) -> str:
        """The loopback password: kept in the private dir (root's, mode 0600) so a data
        dir opened again still matches it."""
        f = self.base / ".password"
        if self._initialised and f.exists():
            return f.read_text().strip()
        if self._initialised:
            raise ConfigError(f"{self.data_dir} was initialised without tcp=True")
        password = secrets.token_urlsafe(18)
        f.write_text(password)
        f.chmod(0o600)
        return password

    def _own(self, path: Path) -> None:
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _exec(self, argv: list[str], what: str) -> None:
        argv = self._cmd(argv)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        try:
            r = subprocess.run(
                argv, cwd=self.base, env=env, capture_output=True, text=True, timeout=120
            )
        except subprocess.TimeoutExpired as e:
            raise DatabaseServerError(f"{what} did not finish in {e.timeout}s") from e
        if r.returncode != 0:
            tail = ""
            if self.log_path.exists():
                tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
            out = (r.stderr or r.stdout).strip()
            raise DatabaseServerError(f"{what} exited {r.returncode}: {out}\n{tail}".rstrip())
