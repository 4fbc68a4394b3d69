"""Throwaway TLS certificates made with the ``openssl`` command, for tests and demos.

A certificate authority, a server certificate for ``127.0.0.1`` and ``localhost``
(subject alternative names, so hostname verification passes), and a client
certificate, all signed by that CA; a second, unrelated CA makes a "wrong CA" and
signs a client certificate the first CA's broker must refuse::

    >>> pki = make_pki(tmp_path)                                  # doctest: +SKIP
    >>> pki.ca.cert, pki.server.cert, pki.client.key              # doctest: +SKIP

Keys are unencrypted RSA 2048 and certificates last 2 days: never use them for
anything but a test.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KeyPair", "LocalTLSError", "Pki", "make_ca", "make_certificate", "make_pki"]

DAYS = "2"


class LocalTLSError(RuntimeError):
    """``openssl`` is missing or failed."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate and its unencrypted PEM private key."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class Pki:
    """What :func:`make_pki` made: a CA, a server and a client pair, and an unrelated CA."""

    ca: KeyPair
    server: KeyPair
    client: KeyPair
    other_ca: KeyPair
    """A CA that did not sign the server's certificate: verifying against it must fail."""
    stranger: KeyPair
    """A client certificate signed by ``other_ca``: a broker trusting ``ca`` refuses it."""


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise LocalTLSError("the openssl command is not installed: apt-get install openssl")
    result = subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise LocalTLSError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_ca(directory: Path, name: str) -> KeyPair:
    """A self-signed CA certificate ``<name>.pem`` with key ``<name>.key``."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / f"{name}.pem", directory / f"{name}.key")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS,
        "-subj", f"/CN=delayq test CA {name}",
        "-keyout", str(pair.key), "-out", str(pair.cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    return pair


def make_certificate(
    directory: Path,
    name: str,
    ca: KeyPair,
    *,
    common_name: str,
    alt_names: tuple[str, ...] = (),
    client: bool = False,
) -> KeyPair:
    """A certificate ``<name>.pem`` (key ``<name>.key``) signed by ``ca``.

    ``alt_names`` are ``DNS:...`` or ``IP:...`` entries; ``client`` makes a
    client-authentication certificate instead of a server one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(directory / f"{name}.pem", directory / f"{name}.key")
    request = directory / f"{name}.csr"
    extensions = directory / f"{name}.ext"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}",
    ]
    if alt_names:
        lines.append(f"subjectAltName={','.join(alt_names)}")
    extensions.write_text("\n".join(lines) + "\n", encoding="ascii")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={common_name}",
        "-keyout", str(pair.key), "-out", str(request),
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-days", DAYS, "-extfile", str(extensions), "-out", str(pair.cert),
        cwd=directory,
    )  # fmt: skip
    request.unlink()
    extensions.unlink()
    return pair


def make_pki(directory: str | Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, a client one, and another CA.

    The paths are absolute: openssl runs inside ``directory``, and a broker or a
    client may run elsewhere."""
    directory = Path(directory).resolve()
    ca = make_ca(directory, "ca")
    server = make_certificate(
        directory,
        "server",
        ca,
        common_name="localhost",
        alt_names=("DNS:localhost", "IP:127.0.0.1"),
    )
    client = make_certificate(directory, "client", ca, common_name="delayq-client", client=True)
    other_ca = make_ca(directory, "other-ca")
    stranger = make_certificate(
        directory, "stranger", other_ca, common_name="delayq-stranger", client=True
    )
    return Pki(ca=ca, server=server, client=client, other_ca=other_ca, stranger=stranger)
