"""``delayq spark pack-env``: a virtualenv with delayq for the executors, packed for
``spark-submit --archives ENV.tar.gz#env --conf spark.pyspark.python=./env/bin/python``.

The venv is made with this interpreter (its Python is a link to this Python's base
install, not a copy), delayq and its dependencies installed into it (pip, from the
project directory delayq was installed from, else ``delayq==<this version>`` from the
index), without PySpark (every executor puts its Spark install's own on the workers'
path) and without matplotlib (the report draws on the driver). The executors must run
the same OS and architecture, and have this Python at the same path
(``./env/bin/python`` links to it); else pack on a machine like theirs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from delayq import __version__
from delayq.errors import InvalidInput

__all__ = ["default_source", "pack_env"]

_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "venv", "build", "dist", "site", "*.egg-info", "__pycache__", ".*_cache"
)


def default_source() -> str:
    """What pip installs delayq from: the local project directory this delayq was installed
    from (``pip install -e .`` or ``pip install .``), else ``delayq==<version>``."""
    try:
        direct = metadata.distribution("delayq").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    if direct:
        url = json.loads(direct).get("url", "")
        if url.startswith("file:"):
            path = Path(unquote(urlparse(url).path))
            if (path / "pyproject.toml").exists():
                return str(path)
    return f"delayq=={__version__}"


def _pip_with_python_option() -> bool:
    """Whether this environment's pip can install into another one (``pip --python``,
    pip 22.3 and later)."""
    try:
        version = metadata.version("pip")
    except metadata.PackageNotFoundError:
        return False
    parts = [int(part) for part in version.split(".")[:2] if part.isdigit()]
    return len(parts) == 2 and (parts[0], parts[1]) >= (22, 3)


def _run(command: Sequence[str], what: str) -> None:
    done = subprocess.run(list(command), capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise InvalidInput(f"{what} failed (exit {done.returncode}):\n{tail}")


def pack_env(
    out: Path,
    *,
    source: str | None = None,
    extra: Sequence[str] = (),
    log: bool = True,
) -> Path:
    """Build the executors' environment and pack it into ``out`` (a ``.tar.gz``); return it.

    ``source``: what pip installs delayq from (a project directory, a wheel, a
    requirement; default :func:`default_source`); ``extra``: more requirements (e.g.
    ``redis`` for ``delayq spark cancel --store redis://...``).
    """
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise InvalidInput(f"{out}: the packed environment must be a .tar.gz or .tgz")
    if not out.parent.is_dir():
        raise InvalidInput(f"{out.parent}: no such directory")
    delayq_from = shown = source or default_source()
    with tempfile.TemporaryDirectory(prefix="delayq-env-") as tmp:
        if Path(delayq_from).is_dir():  # built from a copy: pip leaves build/ where it builds
            copy = Path(tmp) / "source"
            shutil.copytree(delayq_from, copy, ignore=_NOT_SOURCE, symlinks=True)
            delayq_from = str(copy)
        wanted = [delayq_from, *extra]
        env = Path(tmp) / "env"
        outer = _pip_with_python_option()
        if log:
            print(
                f"creating a venv with {sys.executable} (Python "
                f"{sys.version_info.major}.{sys.version_info.minor})",
                file=sys.stderr,
            )
        # The executors need no pip: with a pip of our own that can install into another
        # interpreter's environment, the venv gets none (ensurepip alone takes seconds,
        # and pip would be a third of the archive).
        venv = [sys.executable, "-m", "venv", *(["--without-pip"] if outer else []), str(env)]
        _run(venv, "python -m venv")
        python = env / "bin" / "python"
        if log:
            print(f"installing {' '.join([shown, *extra])} into it (pip)", file=sys.stderr)
        pip = (
            [sys.executable, "-m", "pip", "--python", str(python)]
            if outer
            else [str(python), "-m", "pip"]
        )
        _run(
            [
                *pip,
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                *wanted,
            ],
            "pip install " + " ".join([shown, *extra]),
        )
        _run(
            [str(python), "-c", "import delayq, pika, pydantic_core, aio_pika, yaml"],
            "importing delayq in the new venv",
        )
        partial = out.with_name(out.name + ".partial")
        # gzip's own default level: level 9 (tarfile's) took five times as long for an
        # archive 1 % smaller
        with tarfile.open(partial, "w:gz", compresslevel=6) as archive:
            for entry in sorted(env.iterdir()):
                archive.add(entry, arcname=entry.name)
        os.replace(partial, out)
    if log:
        size = out.stat().st_size / 1e6
        print(f"wrote {out} ({size:.1f} MB)", file=sys.stderr)
    return out
