"""A throwaway RabbitMQ node from the installed server, for tests and the demo.

Runs Debian's ``rabbitmq-server`` without systemd and without switching user:
the scripts in ``/usr/lib/rabbitmq/bin`` are called directly with ``HOME``,
node name, ports and data folders pointed at a scratch directory.

>>> with LocalNode() as node:            # doctest: +SKIP
...     print(node.url)                  # amqp://guest:guest@127.0.0.1:<port>/

``LocalNode(management=True)`` also enables the ``rabbitmq_management`` plugin
on a free port of its own (``node.management_url``); without it the node runs
no plugin at all, which is how a broker without the HTTP API looks.
With ``tls=NodeTLS(...)`` the node also listens for TLS (``amqps://``) on a
second free port, :attr:`LocalNode.tls_url` (certificates: :mod:`delayq.local.tls`).

``LocalNode(server="4.0")`` runs RabbitMQ 4.0.5 from a Debian 13 tree instead of the
installed server (see :mod:`delayq.local.rabbitmq`); ``server=None`` follows
``$DELAYQ_RABBITMQ_SERVER`` (default ``"installed"``). A 4.0 node has an epmd of its
own on ``epmd_port`` (nodes of one cluster share one).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from delayq.local.ports import free_port
from delayq.local.probes import BOOT_LOG_WAIT_S, BOOT_LOGGED, amqp_answers, terminate
from delayq.local.rabbitmq import RabbitServer, UnknownServer, kept_env, rabbit_server
from delayq.local.reaper import unwatch, watch

__all__ = [
    "RABBITMQ_BIN",
    "LocalNode",
    "LocalNodeError",
    "NodeTLS",
    "ServerExited",
    "free_port",
    "port_open",
    "server_installed",
]

RABBITMQ_BIN = Path(os.environ.get("DELAYQ_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
"""Where the installed server's scripts are (``server="installed"``)."""


class LocalNodeError(RuntimeError):
    """The local node could not be started or controlled."""


class ServerExited(LocalNodeError):
    """The server process ended before the node listened."""


def server_installed(server: str | None = None) -> bool:
    """Whether ``server`` (default: ``$DELAYQ_RABBITMQ_SERVER``, else the installed one)
    can be started here."""
    try:
        return _server(server).installed()
    except LocalNodeError:
        return False


def _server(name: str | None) -> RabbitServer:
    try:
        found = rabbit_server(name)
    except UnknownServer as exc:
        raise LocalNodeError(str(exc)) from None
    if found.root is None:
        return RabbitServer(found.name, RABBITMQ_BIN)
    return found


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class NodeTLS:
    """A TLS listener for a :class:`LocalNode` (RabbitMQ's ``ssl_options``)."""

    cacertfile: Path
    """CA certificates the node trusts for client certificates."""
    certfile: Path
    keyfile: Path
    verify_peer: bool = False
    """Ask clients for a certificate and verify it against ``cacertfile``."""
    fail_if_no_peer_cert: bool = False
    """Refuse clients that send no certificate (needs ``verify_peer``)."""

    def config(self, port: int) -> dict[str, str]:
        """The ``rabbitmq.conf`` lines of this listener on ``port``."""
        return {
            "listeners.ssl.default": str(port),
            "ssl_options.cacertfile": str(self.cacertfile),
            "ssl_options.certfile": str(self.certfile),
            "ssl_options.keyfile": str(self.keyfile),
            "ssl_options.verify": "verify_peer" if self.verify_peer else "verify_none",
            "ssl_options.fail_if_no_peer_cert": str(self.fail_if_no_peer_cert).lower(),
        }


class LocalNode:
    """One RabbitMQ node on free ports with its own data folder; stop() removes nothing
    until :meth:`cleanup`, so a restart keeps the parked messages."""

    def __init__(
        self,
        base_dir: str | Path | None = None,
        *,
        port: int | None = None,
        config: Mapping[str, str] | None = None,
        management: bool = False,
        tls: NodeTLS | None = None,
        cookie: str | None = None,
        advanced_config: str | None = None,
        server: str | None = None,
        epmd_port: int | None = None,
    ) -> None:
        self.server = _server(server)
        """The server this node runs (:mod:`delayq.local.rabbitmq`)."""
        if not self.server.installed():
            raise LocalNodeError(self.server.missing())
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="delayq-node-"))
        self.port = port or free_port()
        self.dist_port = free_port()
        self.epmd_port = epmd_port or (free_port() if self.server.root is not None else None)
        """The epmd this node registers with (``None``: Erlang's default, 4369)."""
        self.name = f"delayq-{self.port}@localhost"
        self.management_port = free_port() if management else None
        plugin_config = (
            {"management.tcp.port": str(self.management_port), "management.tcp.ip": "127.0.0.1"}
            if self.management_port is not None
            else {}
        )
        self.tls = tls
        self.tls_port = free_port() if tls is not None else None
        self.config = {
            "listeners.tcp.default": str(self.port),
            "loopback_users": "none",
            "log.console": "false",
            **plugin_config,
            **(tls.config(self.tls_port) if tls is not None and self.tls_port else {}),
            **(config or {}),
        }
        self.cookie = cookie
        """The Erlang cookie; nodes of one cluster share it (None: the node makes its own)."""
        self.advanced_config = advanced_config
        """Erlang terms for ``advanced.config`` (settings rabbitmq.conf cannot express)."""
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"LocalNode({self.name!r}, port={self.port}, server={self.server.name!r})"

    @property
    def version(self) -> str:
        """The version of the server this node runs, e.g. ``"3.10.8"`` or ``"4.0.5"``."""
        return self.server.version

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def management_url(self) -> str | None:
        """The HTTP API's URL when the node runs the management plugin, else ``None``."""
        if self.management_port is None:
            return None
        return f"http://guest:guest@127.0.0.1:{self.management_port}/"

    @property
    def tls_url(self) -> str:
        """The ``amqps://`` URL of the TLS listener, without TLS options (add them)."""
        if self.tls_port is None:
            raise LocalNodeError("this node was started without tls=NodeTLS(...)")
        return f"amqps://guest:guest@127.0.0.1:{self.tls_port}/"

    def env(self) -> dict[str, str]:
        """The node's environment: what :func:`~delayq.local.rabbitmq.kept_env` keeps of the
        caller's, then the node's own."""
        base = self.base_dir
        return {
            **kept_env(),
            "HOME": str(base),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            # A node that fails to start writes its crash dump here, not in the caller's
            # working directory (a checkout, say).
            "ERL_CRASH_DUMP": str(base / "erl_crash.dump"),
            **self._epmd_env(),
        }

    def _epmd_env(self) -> dict[str, str]:
        if self.epmd_port is None:
            return {}
        return {"ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1"}

    def _binds(self) -> list[Path]:
        """Host folders a server in a tree must see: its own, and the TLS files'."""
        folders = [self.base_dir]
        if self.tls is not None:
            folders += [
                p.parent for p in (self.tls.cacertfile, self.tls.certfile, self.tls.keyfile)
            ]
        return folders

    def _write_files(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key} = {value}" for key, value in self.config.items()]
        (self.base_dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        plugins = "rabbitmq_management" if self.management_port is not None else ""
        (self.base_dir / "enabled_plugins").write_text(f"[{plugins}].\n")
        (self.base_dir / "rabbitmq-env.conf").write_text("")
        advanced = self.base_dir / "advanced.config"
        if self.advanced_config is not None:
            advanced.write_text(self.advanced_config)
        elif not advanced.exists():
            advanced.write_text("[].\n")
        if self.cookie is not None:  # HOME is base_dir: the node and rabbitmqctl read it there
            cookie = self.base_dir / ".erlang.cookie"
            if cookie.exists():
                cookie.chmod(0o600)
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)  # Erlang refuses a cookie file others can read

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 90.0, attempts: int = 3) -> LocalNode:
        """Start the node and wait until it accepts AMQP connections.

        A server that exits before its boot ends is started again, up to
        ``attempts`` times: on a loaded machine a restart now and then found its
        old instance's name not yet released (the server then exits at once), and a
        4.0.5 node once stopped between opening its AMQP listener and the end of its
        boot (CI, session 35). The error of the last attempt carries the server's
        output.
        """
        if self.running:
            return self
        self._write_files()
        deadline = time.monotonic() + timeout_s
        for attempt in range(1, attempts + 1):
            logged_before = self._log_size()
            self._spawn()
            try:
                self._await_port(self.port, deadline)
                if self.tls_port is not None:
                    self._await_port(self.tls_port, deadline)
                self._await_amqp(deadline)
                self._await_boot(logged_before, deadline)
                break
            except LocalNodeError as exc:
                if self.running:  # alive but not answering: no second instance beside it
                    raise
                if attempt == attempts or time.monotonic() + 2 > deadline:
                    if isinstance(exc, ServerExited):
                        raise
                    raise LocalNodeError(
                        f"{exc}\n(the server exited; its output:\n{self._server_out_tail()})"
                    ) from exc
                if "dist_port_already_used" in str(exc):
                    # Taken since it was picked: the distribution port is the node's own
                    # business (clients never see it), so another one will do.
                    self.dist_port = free_port()
                time.sleep(2.0 * attempt)
        if self.management_port is not None:
            self._await_port(self.management_port, deadline)
        return self

    def _spawn(self) -> None:
        with open(self.base_dir / "server.out", "ab") as log:
            self._process = subprocess.Popen(
                self.server.command("rabbitmq-server", [], binds=self._binds(), own_pids=True),
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        watch(self._process.pid)  # ends with this process, however it ends

    def _server_out_tail(self, lines: int = 8) -> str:
        try:
            text = (self.base_dir / "server.out").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def _await_port(self, port: int, deadline: float) -> None:
        """Wait until the node listens on ``port``; stop it if that takes past ``deadline``."""
        while not port_open(port):
            process = self._process
            if process is not None and process.poll() is not None:
                self._process = None
                raise ServerExited(
                    f"rabbitmq-server exited with {process.returncode}; see "
                    f"{self.base_dir / 'server.out'} and {self.base_dir / 'log'}; "
                    f"its last lines:\n{self._server_out_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise LocalNodeError(f"node {self.name} did not open port {port} in time")
            time.sleep(0.2)

    def _await_amqp(self, deadline: float) -> None:
        """Wait until the node answers an AMQP client on its port."""
        while not amqp_answers(self.port):
            process = self._process
            if process is not None and process.poll() is not None:
                self._process = None
                raise ServerExited(
                    f"rabbitmq-server exited with {process.returncode} after it listened; "
                    f"its last lines:\n{self._server_out_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise LocalNodeError(f"node {self.name} did not answer AMQP clients in time")
            time.sleep(0.1)

    @property
    def log_file(self) -> Path:
        """The node's log (``RABBITMQ_LOG_BASE`` is ``base_dir/log``)."""
        return self.base_dir / "log" / f"{self.name}.log"

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except OSError:
            return 0

    def _await_boot(self, logged_before: int, deadline: float) -> None:
        """Wait until this boot logged its end: RabbitMQ opens its AMQP listener a little
        before its last boot steps and plugins (about 0.1 s here). A node that does not log
        it (file logging off, or above ``info``) is asked by ``rabbitmqctl await_startup``
        after :data:`BOOT_LOG_WAIT_S`."""
        give_up = min(deadline, time.monotonic() + BOOT_LOG_WAIT_S)
        while time.monotonic() < give_up:
            try:
                with self.log_file.open("rb") as log:
                    log.seek(logged_before)
                    if BOOT_LOGGED in log.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.ctl("await_startup", timeout_s=max(5.0, deadline - time.monotonic()))

    def ctl(
        self, *args: str, timeout_s: float = 60.0, check: bool = True, tool: str = "rabbitmqctl"
    ) -> str:
        """Run ``rabbitmqctl`` (or ``tool``, e.g. ``rabbitmq-queues``) against this node and
        return its output."""
        result = subprocess.run(
            self.server.command(tool, ["-n", self.name, *args], binds=self._binds()),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise LocalNodeError(
                f"{tool} {' '.join(args)} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return result.stdout

    def ctl_command(self, tool: str = "rabbitmqctl") -> list[str]:
        """The argv that runs ``tool`` of this node's server (without ``-n``): what
        ``--rabbitmqctl`` takes. It finds the node's cookie and epmd by itself."""
        env = {"HOME": str(self.base_dir), **self._epmd_env()}
        return self.server.command(tool, [], binds=self._binds(), env=env)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the node gracefully (data kept), killing it if it does not stop in time.

        The Erlang VM is sent SIGTERM, on which RabbitMQ stops its applications in order
        as ``rabbitmqctl stop`` has it do (without that tool's own VM: about 0.7 s of CPU
        and a second each time here)."""
        process = self._process
        if process is None or process.poll() is not None:
            self._process = None
            return
        if not terminate(process, timeout_s):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        unwatch(process.pid)
        self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        """Stop the node and delete its data folder if delayq created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> LocalNode:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
