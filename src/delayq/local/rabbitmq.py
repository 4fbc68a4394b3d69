"""Which RabbitMQ server a local node runs: the installed one, or RabbitMQ 4.x from a tree.

* ``"installed"``: the host's ``rabbitmq-server`` (Debian 12 ships 3.10.8), its scripts
  in ``$DELAYQ_RABBITMQ_BIN`` (default ``/usr/lib/rabbitmq/bin``).
* ``"4.0"``: RabbitMQ 4.0.5 on Erlang 27 from Debian 13's own packages, installed in a
  minimal Debian 13 tree (``scripts/setup-rabbitmq-4.sh`` builds it with ``debootstrap``
  into ``$DELAYQ_RABBITMQ_4_ROOT``, default ``/var/lib/delayq/rabbitmq-4.0``).
* ``"4.3"``: RabbitMQ 4.3.x on Erlang 29 from Debian testing ("forky"), the first series
  without Mnesia (so without the delayed-message-exchange plugin), in a tree that
  ``scripts/setup-rabbitmq-4.sh 4.3`` builds into ``$DELAYQ_RABBITMQ_4_3_ROOT`` (default
  ``/var/lib/delayq/rabbitmq-4.3``). Debian testing moves: :attr:`RabbitServer.version`
  says which 4.3 release a tree holds, and tests assert behaviour by version.

A tree server's commands
  run under ``unshare --mount`` + ``chroot`` (root only): ``/tmp``, the temporary folder
  (``$TMPDIR``) and the node's own folders are bind-mounted at the same paths inside a
  mount namespace of their own,
  so nothing is mounted on the host and nothing from Debian 13 is installed on it. The
  server also runs in a PID namespace of its own: its epmd and every process it forks
  end with it.

The server is chosen explicitly (``LocalNode(server="4.3")``, ``--server 4.3``) or by
``$DELAYQ_RABBITMQ_SERVER``; a server that is not there is an error, never a silent
fallback to the other one.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

__all__ = [
    "KEPT_ENV",
    "SERVERS",
    "RabbitServer",
    "UnknownServer",
    "kept_env",
    "rabbit_server",
    "server_choice",
]

SERVERS = ("installed", "4.0", "4.3")
"""The servers a local node can run."""

_ALIASES = {
    "installed": "installed",
    "system": "installed",
    "4.0": "4.0",
    "4": "4.0",
    "4.3": "4.3",
}


@dataclass(frozen=True)
class _Tree:
    """Where a tree server is built: its variable, default folder and Debian release."""

    variable: str
    default: str
    release: str


_TREES = {
    "4.0": _Tree("DELAYQ_RABBITMQ_4_ROOT", "/var/lib/delayq/rabbitmq-4.0", "Debian 13"),
    "4.3": _Tree("DELAYQ_RABBITMQ_4_3_ROOT", "/var/lib/delayq/rabbitmq-4.3", "Debian testing"),
}
_TREE_BIN = Path("/usr/lib/rabbitmq/bin")
_READY_MARK = ".delayq-ready"

KEPT_ENV = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TMP", "TEMP", "USER", "LOGNAME"}
    | {"LD_LIBRARY_PATH"}
)
"""What a node (and its ``rabbitmqctl``) keeps of the caller's environment, with ``LC_*``.

RabbitMQ reads each of its settings from ``RABBITMQ_<NAME>`` or, failing that, from the
bare ``<NAME>`` (``LOGS``, ``LOG_BASE``, ``MNESIA_BASE``, ``CONFIG_FILE``, ``NODENAME``,
``NODE_PORT``, ``HOME``, ``PLUGINS_DIR``, ... about thirty), its scripts a few more
(``SERVER_ERL_ARGS``, ``SCHEDULER_BIND_TYPE``, ...) and Erlang its ``ERL_*``: names a
caller may well have set for something else (``LOGS=/tmp`` stopped every node with
``cannot_log_to_file``). So nothing else passes, the caller's ``RABBITMQ_*`` neither:
a throwaway node is the same wherever it starts."""


def kept_env() -> dict[str, str]:
    """The part of ``os.environ`` a local node keeps (see :data:`KEPT_ENV`)."""
    return {k: v for k, v in os.environ.items() if k in KEPT_ENV or k.startswith("LC_")}


# Run inside the new mount namespace by the host's /bin/sh: bind the folders the node
# reads and writes at their own paths, give a server its /proc, then chroot.
_ENTER = r"""set -e
root=$1; proc=$2; shift 2
while [ "$1" != "--" ]; do
  mkdir -p "$root$1"; mount --bind "$1" "$root$1"; shift
done
shift
if [ "$proc" = yes ]; then mount -t proc proc "$root/proc"; fi
exec chroot "$root" "$@"
"""


class UnknownServer(ValueError):
    """A server name that is not one of :data:`SERVERS`."""


def server_choice(name: str | None = None) -> str:
    """The canonical name of ``name``, else of ``$DELAYQ_RABBITMQ_SERVER``, else
    ``"installed"``."""
    raw = name if name is not None else os.environ.get("DELAYQ_RABBITMQ_SERVER", "installed")
    choice = _ALIASES.get(raw.strip().lower())
    if choice is None:
        source = "" if name is not None else " ($DELAYQ_RABBITMQ_SERVER)"
        raise UnknownServer(
            f"unknown RabbitMQ server {raw!r}{source}: choose one of {', '.join(SERVERS)}"
        )
    return choice


@dataclass(frozen=True)
class RabbitServer:
    """One RabbitMQ server: where its scripts are and how to run them."""

    name: str
    bin_dir: Path
    """The scripts' folder as the server sees it (inside the tree for ``"4.0"``, ``"4.3"``)."""
    root: Path | None = None
    """The Debian tree the server runs in (``chroot``), ``None`` for the host's own."""

    @property
    def host_bin_dir(self) -> Path:
        """The scripts' folder as seen from the host."""
        if self.root is None:
            return self.bin_dir
        return self.root / self.bin_dir.relative_to("/")

    def installed(self) -> bool:
        ready = self.root is None or (self.root / _READY_MARK).exists()
        return ready and (self.host_bin_dir / "rabbitmq-server").exists()

    def missing(self) -> str:
        """What to do when :meth:`installed` is false."""
        if self.root is None:
            return (
                f"RabbitMQ is not installed ({self.bin_dir}/rabbitmq-server is missing): "
                "apt-get install rabbitmq-server"
            )
        tree = _TREES[self.name]
        script = "scripts/setup-rabbitmq-4.sh" + ("" if self.name == "4.0" else f" {self.name}")
        return (
            f"RabbitMQ {self.name} is not set up ({self.root} holds no finished "
            f"{tree.release} tree): run `bash {script}` as root (or "
            f"`bash scripts/setup.sh --test`), or point ${tree.variable} at such a tree"
        )

    @cached_property
    def version(self) -> str:
        """The server's version from its installed files, e.g. ``"3.10.8"``, ``"4.0.5"``
        (``""`` when it cannot be told)."""
        for lib in (self.host_bin_dir.parent / "lib", self.host_bin_dir.parent):
            try:
                names = [p.name for p in lib.iterdir()]
            except OSError:
                continue
            for entry in names:
                found = re.fullmatch(r"rabbitmq_server-(\d+(?:\.\d+)+)", entry)
                if found:
                    return found.group(1)
        return ""

    def command(
        self,
        tool: str,
        args: Sequence[str],
        *,
        binds: Sequence[Path] = (),
        own_pids: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The argv that runs ``tool`` (``rabbitmq-server``, ``rabbitmqctl``, ...; an
        absolute path runs that program of the server's system) with ``args`` and ``env``.
        For a tree, ``binds`` are host folders the tool must see at the same path (``/tmp``
        and the temporary folder always are: a file a caller writes there, definitions to
        import say, is found by the path it has); ``own_pids`` gives it a PID namespace
        whose processes all end when it does (for the server)."""
        program = tool if tool.startswith("/") else str(self.bin_dir / tool)
        settings = [f"{key}={value}" for key, value in (env or {}).items()]
        if self.root is None:
            return ["/usr/bin/env", *settings, program, *args] if settings else [program, *args]
        folders = _outermost([Path("/tmp"), *_temp_folder(self.root), *binds])
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if own_pids:
            unshare += ["--pid", "--fork", "--kill-child"]
        return [
            *unshare, "--", "/bin/sh", "-c", _ENTER, "delayq-enter",
            str(self.root), "yes" if own_pids else "no", *map(str, folders), "--",
            "/usr/bin/env", "LC_ALL=C.UTF-8", "LANG=C.UTF-8", *settings, program, *args,
        ]  # fmt: skip


def _temp_folder(root: Path) -> list[Path]:
    """Python's temporary folder (``$TMPDIR``), unless binding it would hide the tree at
    ``root`` or part of it (``/``, ``/var`` for a tree in ``/var/lib``)."""
    temp = Path(tempfile.gettempdir()).resolve()
    tree = root.resolve()
    return [] if temp == tree or temp in tree.parents else [temp]


def _outermost(paths: list[Path]) -> list[Path]:
    """Absolute, resolved, without any folder inside another of the list."""
    resolved = sorted({path.resolve() for path in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


def rabbit_server(name: str | None = None) -> RabbitServer:
    """The server called ``name`` (see :func:`server_choice`)."""
    choice = server_choice(name)
    if choice == "installed":
        return RabbitServer(
            "installed", Path(os.environ.get("DELAYQ_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
        )
    tree = _TREES[choice]
    root = Path(os.environ.get(tree.variable) or tree.default)
    return RabbitServer(choice, _TREE_BIN, root=root)
