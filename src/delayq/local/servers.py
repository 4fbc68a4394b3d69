"""Throwaway Redis and PostgreSQL servers from the installed Debian packages, for tests.

Like :class:`delayq.local.node.LocalNode`: no systemd, no system service, a scratch
directory of their own, free ports on 127.0.0.1, and :meth:`stop` signals only the
process this object started (by its PID).

PostgreSQL refuses to run as root, so when the caller is root, ``initdb`` and
``postgres`` run as the ``postgres`` system user (made by Debian's package) in a
scratch directory owned by that user.

>>> with LocalRedis() as server:         # doctest: +SKIP
...     print(server.url)                # redis://127.0.0.1:<port>/0
>>> with LocalPostgres() as server:      # doctest: +SKIP
...     print(server.dsn)                # postgresql://postgres@127.0.0.1:<port>/postgres
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from delayq.local.node import free_port
from delayq.local.reaper import unwatch, watch

__all__ = [
    "LocalPostgres",
    "LocalRedis",
    "LocalServerError",
    "postgres_bin_dir",
    "redis_server_path",
]


class LocalServerError(RuntimeError):
    """A local server could not be found, started or stopped."""


def redis_server_path() -> Path | None:
    """``$DELAYQ_REDIS_SERVER``, else ``redis-server`` on PATH (``None`` when missing)."""
    explicit = os.environ.get("DELAYQ_REDIS_SERVER")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    found = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin:/usr/sbin")
    return Path(found) if found else None


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path))


def postgres_bin_dir() -> Path | None:
    """``$DELAYQ_POSTGRES_BIN``, else the newest ``/usr/lib/postgresql/*/bin`` (Debian),
    else the directory of ``initdb`` on PATH; ``None`` when none has initdb and postgres."""
    explicit = os.environ.get("DELAYQ_POSTGRES_BIN")
    if explicit:
        candidates = [explicit]
    else:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    return None


def _stop_process(process: subprocess.Popen[bytes], first: int, timeout_s: float) -> None:
    """Send ``first`` to the process we started; if it outlives the timeout, SIGKILL its
    process group (its own session: the server and the children it forked, nothing else)."""
    if process.poll() is not None:
        unwatch(process.pid)
        return
    try:
        process.send_signal(first)
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)
    unwatch(process.pid)


class _LocalServer:
    kind = "server"

    def __init__(self, base_dir: str | Path | None, prefix: str, port: int | None) -> None:
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix=prefix))
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process else None

    @property
    def log_path(self) -> Path:
        return self.base_dir / "server.out"

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])

    def _spawn(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **kwargs,
            )
        watch(process.pid)  # ends with this process, however it ends
        return process

    def _ready(self) -> bool:
        raise NotImplementedError

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        process = self._process
        assert process is not None
        while not self._ready():
            if process.poll() is not None:
                self._process = None
                raise LocalServerError(
                    f"{self.kind} exited with {process.returncode}; "
                    f"last lines of {self.log_path}:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise LocalServerError(
                    f"{self.kind} did not become ready on port {self.port} in {timeout_s:g} s; "
                    f"last lines of {self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(0.05)

    def start(self, timeout_s: float = 30.0) -> Any:
        raise NotImplementedError

    def stop(self, timeout_s: float = 30.0) -> None:
        raise NotImplementedError

    def cleanup(self) -> None:
        """Stop the server and delete its directory if delayq created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


class LocalRedis(_LocalServer):
    """One ``redis-server`` on a free port of 127.0.0.1, no persistence, own directory."""

    kind = "redis-server"

    def __init__(self, base_dir: str | Path | None = None, *, port: int | None = None) -> None:
        binary = redis_server_path()
        if binary is None:
            raise LocalServerError(
                "Redis is not installed (no redis-server on PATH or at $DELAYQ_REDIS_SERVER): "
                "apt-get install redis-server"
            )
        self.binary = binary
        super().__init__(base_dir, "delayq-redis-", port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def start(self, timeout_s: float = 30.0) -> LocalRedis:
        """Start the server and wait until it answers PING."""
        if self.running:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._process = self._spawn(
            [
                str(self.binary),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.base_dir),
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--logfile", "",
            ],
            cwd=self.base_dir,
        )  # fmt: skip
        self._wait_ready(timeout_s)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``)."""
        if self._process is not None:
            _stop_process(self._process, signal.SIGTERM, timeout_s)
        self._process = None

    def __enter__(self) -> LocalRedis:
        return self.start()


class LocalPostgres(_LocalServer):
    """One PostgreSQL cluster (``initdb`` once, then ``postgres``) on a free port of
    127.0.0.1 with trust authentication, in its own directory; as root it runs as the
    ``postgres`` system user. Throwaway: ``fsync`` is off."""

    kind = "postgres"

    def __init__(
        self,
        base_dir: str | Path | None = None,
        *,
        port: int | None = None,
        run_as: str = "postgres",
    ) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise LocalServerError(
                "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb, no initdb "
                "on PATH, nothing at $DELAYQ_POSTGRES_BIN): apt-get install postgresql"
            )
        self.bin_dir = bin_dir
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam(run_as)
            except KeyError:
                raise LocalServerError(
                    f"PostgreSQL will not run as root and there is no {run_as!r} user to run it "
                    "as (Debian's postgresql package creates one)"
                ) from None
        super().__init__(base_dir, "delayq-pg-", port)

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir / "sock"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_user(self) -> dict[str, Any]:
        """Popen arguments that run a command as the server's user, in its directory."""
        env = {
            "PATH": f"{self.bin_dir}:/usr/bin:/bin",
            "HOME": str(self.base_dir),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        kwargs: dict[str, Any] = {"env": env, "cwd": self.base_dir}
        if self._user is not None:
            kwargs.update(user=self._user.pw_uid, group=self._user.pw_gid, extra_groups=[])
        return kwargs

    def _prepare_dirs(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if self._user is not None:
            for path in (self.base_dir, self.socket_dir):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
            os.chmod(self.base_dir, 0o700)

    def _initdb(self, timeout_s: float) -> None:
        argv = [
            str(self.bin_dir / "initdb"),
            "-D", str(self.data_dir),
            "-A", "trust",
            "-U", "postgres",
            "-E", "UTF8",
            "--no-locale",
            "--no-sync",
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            result = subprocess.run(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
                **self._as_user(),
            )
        if result.returncode != 0:
            raise LocalServerError(
                f"initdb failed ({result.returncode}); last lines of {self.log_path}:\n"
                f"{self._log_tail()}"
            )

    def _ready(self) -> bool:
        isready = self.bin_dir / "pg_isready"
        if not isready.is_file():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False
        result = subprocess.run(
            [str(isready), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return result.returncode == 0

    def start(self, timeout_s: float = 60.0) -> LocalPostgres:
        """Create the cluster if needed, start the server and wait until it accepts
        connections."""
        if self.running:
            return self
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(timeout_s)
        self._process = self._spawn(
            [
                str(self.bin_dir / "postgres"),
                "-D", str(self.data_dir),
                "-p", str(self.port),
                "-k", str(self.socket_dir),
                "-c", "listen_addresses=127.0.0.1",
                "-c", "fsync=off",
                "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off",
            ],
            **self._as_user(),
        )  # fmt: skip
        self._wait_ready(timeout_s)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server with a fast shutdown (SIGINT, what ``pg_ctl stop -m fast``
        sends), then SIGKILL after ``timeout_s``. The data directory stays until
        :meth:`cleanup`."""
        if self._process is not None:
            _stop_process(self._process, signal.SIGINT, timeout_s)
        self._process = None

    def __enter__(self) -> LocalPostgres:
        return self.start()
