"""TLS for ``amqps://`` URLs: the options, the ``ssl.SSLContext``, and what a failure means.

Both adapters (pika and aio-pika) take their TLS settings from here, so they
verify the same way and fail with the same words. The options travel in the
URL's query (parsed by :func:`delayq.urls.parse_url`)::

    amqps://app:secret@rabbit.internal:5671/prod?cafile=/etc/delayq/ca.pem
        &certfile=/etc/delayq/client.pem&keyfile=/etc/delayq/client.key

======================  ==========================================================
``cafile``              PEM file of the CA(s) that signed the broker's certificate
                        (default: the system's trusted CAs)
``certfile``            PEM client certificate, for brokers that ask for one
                        (``ssl_options.verify = verify_peer``)
``keyfile``             PEM private key of ``certfile`` (unencrypted; omit it when
                        ``certfile`` holds the key too)
``verify``              ``true`` (default) checks the broker's certificate and
                        name; ``false`` checks nothing (tests only: anyone on the
                        path can read and change the traffic)
``server_hostname``     the name the broker's certificate must carry, when it is
                        not the URL's host (e.g. connecting through an IP address)
======================  ==========================================================

``DELAYQ_TLS_CAFILE``, ``DELAYQ_TLS_CERTFILE`` and ``DELAYQ_TLS_KEYFILE`` give
defaults for ``amqps://`` URLs that do not name the file themselves.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delayq.errors import InvalidURL

__all__ = [
    "ENV_DEFAULTS",
    "TLS_OPTIONS",
    "TLSOptions",
    "describe_tls_failure",
    "describe_tls_reset",
    "tls_options",
    "wrapped_errors",
]

TLS_OPTIONS = ("cafile", "certfile", "keyfile", "verify", "server_hostname")
"""The query options of an ``amqps://`` URL that delayq reads."""

ENV_DEFAULTS = {
    "cafile": "DELAYQ_TLS_CAFILE",
    "certfile": "DELAYQ_TLS_CERTFILE",
    "keyfile": "DELAYQ_TLS_KEYFILE",
}
"""Environment variables that give a file option its default (``amqps://`` only)."""

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class _ServerNameContext(ssl.SSLContext):
    """An SSLContext that checks the broker's certificate against a fixed name.

    pika passes ``server_hostname`` itself, but aio-pika opens the socket with
    the URL's host and offers no way to change it: the name is carried by the
    context, so both adapters check the same name.
    """

    server_name: str | None = None

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:
        if self.server_name is not None:
            kwargs["server_hostname"] = self.server_name
        return super().wrap_socket(sock, *args, **kwargs)

    def wrap_bio(self, incoming: Any, outgoing: Any, *args: Any, **kwargs: Any) -> Any:
        if self.server_name is not None:
            kwargs["server_hostname"] = self.server_name
        return super().wrap_bio(incoming, outgoing, *args, **kwargs)


@dataclass(frozen=True, slots=True)
class TLSOptions:
    """How to make and check a TLS connection to the broker (see the module's table)."""

    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True
    server_hostname: str | None = None

    def describe_trust(self) -> str:
        """Which CAs are trusted, for error messages."""
        if not self.verify:
            return "verification disabled (verify=false)"
        return f"CA file {self.cafile}" if self.cafile else "the system's trusted CAs"

    def context(self) -> ssl.SSLContext:
        """A client ``SSLContext``: TLS 1.2 or newer, the broker verified unless ``verify`` is off.

        Raises :class:`~delayq.errors.InvalidURL` when a file cannot be loaded
        (not PEM, or a key that does not match its certificate).
        """
        context = _ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.server_name = self.server_hostname
        if self.verify:
            context.verify_mode = ssl.CERT_REQUIRED
            context.check_hostname = True
            if self.cafile:
                _load(self.cafile, "cafile", lambda: context.load_verify_locations(self.cafile))
            else:
                context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.certfile:
            certfile = self.certfile
            _load(
                certfile,
                "certfile/keyfile",
                lambda: context.load_cert_chain(certfile, self.keyfile),
            )
        return context


def _load(path: str, what: str, action: Any) -> None:
    try:
        action()
    except ssl.SSLError as exc:
        raise InvalidURL(
            f"TLS {what} {path} cannot be used: {exc.reason or exc} (PEM files expected; "
            "the key must belong to the certificate and be unencrypted)"
        ) from None
    except OSError as exc:
        raise InvalidURL(f"TLS {what} {path} cannot be read: {exc.strerror or exc}") from None


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidURL(f"TLS option verify={value!r} must be true or false")


def tls_options(
    scheme: str, query: Mapping[str, str], environ: Mapping[str, str]
) -> TLSOptions | None:
    """The TLS options of a URL (``None`` for ``amqp://``), files checked to exist.

    ``query`` holds only the TLS keys of the URL's query; ``environ`` gives the
    ``DELAYQ_TLS_*`` defaults.
    """
    if scheme != "amqps":
        if query:
            raise InvalidURL(
                f"TLS option {sorted(query)[0]}= needs an amqps:// URL, not {scheme}://"
            )
        return None
    files: dict[str, str | None] = {}
    for option, variable in ENV_DEFAULTS.items():
        value = query.get(option) or environ.get(variable) or None
        if value is not None and not Path(value).is_file():
            source = f"{option}=" if option in query else f"${variable}"
            raise InvalidURL(f"TLS {source} names {value}, which is not a file")
        files[option] = value
    if files["keyfile"] and not files["certfile"]:
        raise InvalidURL("TLS keyfile= is given without certfile=: name the client certificate")
    server_hostname = query.get("server_hostname")
    if server_hostname is not None and not server_hostname.strip():
        raise InvalidURL("TLS option server_hostname= must not be empty")
    return TLSOptions(
        cafile=files["cafile"],
        certfile=files["certfile"],
        keyfile=files["keyfile"],
        verify=_flag(query["verify"]) if "verify" in query else True,
        server_hostname=server_hostname,
    )


# What a TLS failure means -------------------------------------------------------------------------

_REASON = re.compile(r"\[SSL: ([A-Z0-9_]+)\]")

_CLIENT_CERT_REQUIRED = ("CERTIFICATE_REQUIRED",)
_CLIENT_CERT_REFUSED = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "DECRYPT_ERROR")
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG")


def wrapped_errors(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps: causes, contexts, exceptions in its args, and
    pika's ``exception`` / ``exceptions`` attributes."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        inner = [current.__cause__, current.__context__, *current.args]
        inner.append(getattr(current, "exception", None))
        inner.extend(getattr(current, "exceptions", None) or ())
        todo.extend(e for e in inner if isinstance(e, BaseException))


def _reason(exc: BaseException) -> tuple[str, str] | None:
    """The OpenSSL reason code and its detail, from an ``ssl.SSLError`` or from text
    (pika sometimes wraps the SSL error's text in another exception's message)."""
    for error in wrapped_errors(exc):
        detail = getattr(error, "verify_message", None)
        if isinstance(error, ssl.SSLCertVerificationError) and detail:
            return "CERTIFICATE_VERIFY_FAILED", str(detail)
        reason = getattr(error, "reason", None)
        if isinstance(error, ssl.SSLError) and reason:
            return str(reason), str(reason)
    for error in wrapped_errors(exc):
        found = _REASON.search(str(error))
        if found is not None:
            return found.group(1), found.group(1)
    return None


def describe_tls_failure(exc: BaseException, options: TLSOptions, where: str) -> str | None:
    """A plain message for a connection that failed in TLS, else ``None``.

    ``where`` is the redacted URL. The same message for pika's and aiormq's
    errors, so both adapters say the same thing.
    """
    found = _reason(exc)  # the URL is passed in redacted: nothing here sees a password
    if found is None:
        return None
    code, detail = found
    if code == "CERTIFICATE_VERIFY_FAILED":
        hint = (
            " (set server_hostname= to the name in the broker's certificate, or connect "
            "by that name)"
            if "hostname" in detail.lower() or "ip address mismatch" in detail.lower()
            else " (is it the CA that signed the broker's certificate?)"
        )
        return (
            f"TLS verification failed for the broker at {where}: {detail}; "
            f"trusted: {options.describe_trust()}{hint}"
        )
    if any(code.endswith(suffix) for suffix in _CLIENT_CERT_REQUIRED):
        return (
            f"TLS handshake with the broker at {where} failed: the broker requires a "
            "client certificate (set certfile= and keyfile=, or $DELAYQ_TLS_CERTFILE "
            f"and $DELAYQ_TLS_KEYFILE) [{code}]"
        )
    if code.endswith("HANDSHAKE_FAILURE"):  # TLS 1.2 says this for several causes
        if options.certfile is None:
            return (
                f"TLS handshake with the broker at {where} failed: the broker may require a "
                "client certificate (set certfile= and keyfile=), or shares no TLS version "
                f"or cipher with this client [{code}]"
            )
        return (
            f"TLS handshake with the broker at {where} failed: the broker refused the "
            f"client certificate {options.certfile}, or shares no TLS version or cipher "
            f"with this client [{code}]"
        )
    if any(code.endswith(suffix) for suffix in _CLIENT_CERT_REFUSED):
        return (
            f"TLS handshake with the broker at {where} failed: the broker does not trust "
            f"the client certificate {options.certfile or '(none given)'} [{code}]"
        )
    if code in _NOT_TLS:
        return (
            f"TLS handshake with the broker at {where} failed: the port does not speak TLS "
            f"(is it the amqp:// port? RabbitMQ's TLS port is usually 5671) [{code}]"
        )
    return f"TLS handshake with the broker at {where} failed [{code}]"


def describe_tls_reset(exc: BaseException, options: TLSOptions) -> str | None:
    """A hint when an ``amqps://`` connection was reset during its TLS setup.

    A broker that requires a client certificate sends its alert and closes the
    socket; when the client's AMQP greeting is still unread there, the close
    is a reset and the alert is lost (aiormq sees this about once in six
    tries). A reset can have other causes, so the connection is retried, and
    this hint ends the final error.
    """
    if not any(_is_reset(e) for e in wrapped_errors(exc)):
        return None
    if options.certfile is not None:
        # TLS 1.3: the client's handshake is over before the broker checks the
        # certificate, so its "unknown CA" alert can be lost to the same reset.
        return (
            "the broker closed the TLS connection during setup: it may not trust the client "
            f"certificate {options.certfile} (is it signed by a CA in the broker's cacertfile?)"
        )
    return (
        "the broker closed the TLS connection during setup: it may require a client "
        "certificate (set certfile= and keyfile=, or $DELAYQ_TLS_CERTFILE and "
        "$DELAYQ_TLS_KEYFILE)"
    )


_RESET_TEXT = ("SSLEOFError", "EOF occurred in violation of protocol", "ConnectionResetError")


def _is_reset(error: BaseException) -> bool:
    """A reset during TLS setup: the error itself, or (pika) its text inside another's,
    as in ``IncompatibleProtocolError('StreamLostError: (... SSLEOFError(8, ...))')``."""
    if isinstance(error, (ConnectionResetError, ssl.SSLEOFError)):
        return True
    return any(marker in str(error) for marker in _RESET_TEXT)
