"""TLS options in the broker URL, the SSLContext built from them, and what failures say.

No broker here: certificates come from the ``openssl`` command (delayq.local.tls);
the real handshakes are in tests/integration/test_tls.py.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from delayq import InvalidURL
from delayq.local.tls import Pki, make_pki
from delayq.tls import TLSOptions, describe_tls_failure, describe_tls_reset
from delayq.urls import parse_url, redact, validate_url


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def url_with(**query: Any) -> str:
    from urllib.parse import urlencode

    return f"amqps://app:pw-secret@rabbit:5671/prod?{urlencode(query)}"


# --- parsing -------------------------------------------------------------------------------------


def test_plain_urls_have_no_tls_and_pass_through() -> None:
    broker = parse_url("amqp://u:p@host:5672/vh", environ={})
    assert broker.tls is None
    assert broker.client_url == "amqp://u:p@host:5672/vh"
    assert broker.host == "host"


def test_tls_options_are_read_and_removed_from_the_clients_url(pki: Pki) -> None:
    url = url_with(
        cafile=pki.ca.cert,
        certfile=pki.client.cert,
        keyfile=pki.client.key,
        server_hostname="rabbit.internal",
        heartbeat=30,
    )
    broker = parse_url(url, environ={})
    assert broker.tls == TLSOptions(
        cafile=str(pki.ca.cert),
        certfile=str(pki.client.cert),
        keyfile=str(pki.client.key),
        verify=True,
        server_hostname="rabbit.internal",
    )
    assert broker.client_url == "amqps://app:pw-secret@rabbit:5671/prod?heartbeat=30"
    assert "pw-secret" not in repr(broker)
    assert validate_url(url) == url


def test_amqps_without_options_verifies_against_the_system_cas() -> None:
    broker = parse_url("amqps://h/", environ={})
    assert broker.tls == TLSOptions()
    assert broker.tls is not None and broker.tls.describe_trust() == "the system's trusted CAs"


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("1", True), ("FALSE", False), ("no", False)]
)
def test_verify_flag(value: str, expected: bool) -> None:
    broker = parse_url(f"amqps://h/?verify={value}", environ={})
    assert broker.tls is not None and broker.tls.verify is expected


def test_environment_gives_defaults_for_amqps_only(pki: Pki) -> None:
    env = {
        "DELAYQ_TLS_CAFILE": str(pki.ca.cert),
        "DELAYQ_TLS_CERTFILE": str(pki.client.cert),
        "DELAYQ_TLS_KEYFILE": str(pki.client.key),
    }
    broker = parse_url("amqps://h/", environ=env)
    assert broker.tls == TLSOptions(str(pki.ca.cert), str(pki.client.cert), str(pki.client.key))
    assert parse_url("amqp://h/", environ=env).tls is None
    explicit = parse_url(f"amqps://h/?cafile={pki.other_ca.cert}", environ=env)
    assert explicit.tls is not None and explicit.tls.cafile == str(pki.other_ca.cert)


@pytest.mark.parametrize(
    ("url", "env", "message"),
    [
        ("amqps://u:pw-secret@h/?cafle=/x", {}, "unknown option 'cafle'; known options: cafile"),
        ("amqps://u:pw-secret@h/?cafile=/no/ca.pem", {}, "cafile= names /no/ca.pem, which is not"),
        (
            "amqps://u:pw-secret@h/",
            {"DELAYQ_TLS_CERTFILE": "/no/client.pem"},
            "$DELAYQ_TLS_CERTFILE names /no/client.pem",
        ),
        ("amqp://u:pw-secret@h/?verify=false", {}, "verify= needs an amqps:// URL"),
        ("amqps://u:pw-secret@h/?verify=sometimes", {}, "verify='sometimes' must be true or"),
        ("amqps://u:pw-secret@h/?server_hostname=", {}, "server_hostname= must not be empty"),
        ("amqps://u:pw-secret@h/?verify=1&verify=0", {}, "gives option 'verify' twice"),
        ("amqp://u:pw-secret@h/?heartbeat=soon", {}, "heartbeat='soon' must be whole seconds"),
        ("amqp://u:pw-secret@h/?ssl_options=x", {}, "unknown option 'ssl_options'"),
    ],
)
def test_bad_options_are_clear_invalid_url_errors(
    url: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidURL) as info:
        parse_url(url, environ=env)
    assert message in str(info.value)
    assert "pw-secret" not in str(info.value)


def test_keyfile_needs_certfile(pki: Pki) -> None:
    with pytest.raises(InvalidURL, match="keyfile= is given without certfile="):
        parse_url(f"amqps://h/?keyfile={pki.client.key}", environ={})


# --- the SSLContext ------------------------------------------------------------------------------


def test_context_verifies_the_broker_by_default(pki: Pki) -> None:
    context = TLSOptions(cafile=str(pki.ca.cert)).context()
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    subjects = [dict(x[0] for x in ca["subject"]) for ca in context.get_ca_certs()]
    assert subjects == [{"commonName": "delayq test CA ca"}]


def test_context_with_verify_false_checks_nothing() -> None:
    context = TLSOptions(verify=False).context()
    assert context.verify_mode is ssl.CERT_NONE
    assert context.check_hostname is False


def test_context_loads_the_client_certificate(pki: Pki) -> None:
    TLSOptions(certfile=str(pki.client.cert), keyfile=str(pki.client.key)).context()
    combined = pki.client.cert.parent / "combined.pem"
    combined.write_bytes(pki.client.cert.read_bytes() + pki.client.key.read_bytes())
    TLSOptions(certfile=str(combined)).context()  # the key in the certificate's file


def test_a_key_of_another_certificate_is_a_clear_error(pki: Pki) -> None:
    with pytest.raises(InvalidURL, match="cannot be used: KEY_VALUES_MISMATCH"):
        TLSOptions(certfile=str(pki.client.cert), keyfile=str(pki.server.key)).context()


def test_a_cafile_that_is_not_pem_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(InvalidURL, match=r"TLS cafile .*ca\.pem cannot be used"):
        TLSOptions(cafile=str(junk)).context()


def test_the_server_certificate_names_localhost_and_the_loopback_address(pki: Pki) -> None:
    decoded = ssl._ssl._test_decode_cert(str(pki.server.cert))  # type: ignore[attr-defined]
    assert ("DNS", "localhost") in decoded["subjectAltName"]
    assert ("IP Address", "127.0.0.1") in decoded["subjectAltName"]


def handshake(client: ssl.SSLContext, server: ssl.SSLContext, host: str | None) -> None:
    """A full TLS handshake in memory, through the context's wrap_bio as asyncio does it."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_side=False, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(20):
        done = 0
        for side in (c, s):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            return
    raise AssertionError("the handshake did not finish")


@pytest.fixture(scope="module")
def server_context(pki: Pki) -> ssl.SSLContext:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server.cert, pki.server.key)
    return server


def test_server_hostname_replaces_the_name_checked(pki: Pki, server_context: Any) -> None:
    # aio-pika connects with the URL's host; the context checks server_hostname instead.
    handshake(TLSOptions(cafile=str(pki.ca.cert)).context(), server_context, "127.0.0.1")
    pinned = TLSOptions(cafile=str(pki.ca.cert), server_hostname="localhost").context()
    handshake(pinned, server_context, "10.9.8.7")
    wrong = TLSOptions(cafile=str(pki.ca.cert), server_hostname="example.com").context()
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(wrong, server_context, "127.0.0.1")


def test_a_wrong_ca_fails_the_handshake(pki: Pki, server_context: Any) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(TLSOptions(cafile=str(pki.other_ca.cert)).context(), server_context, "localhost")


# --- what a failure says -------------------------------------------------------------------------

WHERE = redact("amqps://app:pw-secret@rabbit:5671/")


def real_verify_error(pki: Pki, server_context: ssl.SSLContext) -> ssl.SSLError:
    with pytest.raises(ssl.SSLCertVerificationError) as info:
        handshake(TLSOptions(cafile=str(pki.other_ca.cert)).context(), server_context, "localhost")
    return info.value


def test_verification_failure_names_the_ca_file(pki: Pki, server_context: Any) -> None:
    error = real_verify_error(pki, server_context)
    wrapped = ConnectionError("connect failed")
    wrapped.__cause__ = error
    options = TLSOptions(cafile=str(pki.other_ca.cert))
    message = describe_tls_failure(wrapped, options, WHERE)
    assert message is not None
    assert message.startswith("TLS verification failed for the broker at amqps://app:***@rabbit")
    assert f"trusted: CA file {pki.other_ca.cert}" in message
    assert "pw-secret" not in message


def test_a_missing_client_certificate_is_named_even_from_a_wrapped_text() -> None:
    # pika wraps the SSL error's text in an IncompatibleProtocolError's message
    text = (
        "StreamLostError: (\"Stream connection lost: SSLError(1, '[SSL: "
        "TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required')\",)"
    )
    message = describe_tls_failure(RuntimeError(text), TLSOptions(), WHERE)
    assert message is not None and "requires a client certificate (set certfile=" in message


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("TLSV1_ALERT_UNKNOWN_CA", "does not trust the client certificate /c.pem"),
        ("SSLV3_ALERT_HANDSHAKE_FAILURE", "refused the client certificate /c.pem, or shares"),
        ("WRONG_VERSION_NUMBER", "the port does not speak TLS"),
        ("SOMETHING_NEW", "TLS handshake with the broker at amqps://app:***@rabbit:5671/ failed"),
    ],
)
def test_failure_kinds(code: str, expected: str) -> None:
    options = TLSOptions(certfile="/c.pem")
    message = describe_tls_failure(OSError(f"[SSL: {code}] oops"), options, WHERE)
    assert message is not None and expected in message


def test_a_tls12_handshake_failure_without_a_certificate_names_both_causes() -> None:
    error = OSError("[SSL: SSLV3_ALERT_HANDSHAKE_FAILURE] sslv3 alert handshake failure")
    message = describe_tls_failure(error, TLSOptions(), WHERE)
    assert message is not None
    assert "may require a client certificate" in message and "no TLS version" in message


def test_other_errors_are_not_tls_failures() -> None:
    assert describe_tls_failure(ConnectionRefusedError(111, "refused"), TLSOptions(), WHERE) is None


def test_pikas_workflow_errors_are_looked_into(pki: Pki, server_context: Any) -> None:
    class PhaseError(Exception):  # like pika's AMQPConnectorTransportSetupError
        def __init__(self, exception: BaseException) -> None:
            super().__init__()
            self.exception = exception

    class WorkflowFailed(Exception):  # like pika's AMQPConnectionWorkflowFailed
        def __init__(self, exceptions: list[BaseException]) -> None:
            super().__init__()
            self.exceptions = tuple(exceptions)

    error = WorkflowFailed([PhaseError(real_verify_error(pki, server_context))])
    message = describe_tls_failure(error, TLSOptions(cafile=str(pki.other_ca.cert)), WHERE)
    assert message is not None and message.startswith("TLS verification failed")


def test_a_reset_during_tls_setup_hints_at_the_client_certificate() -> None:
    reset = ConnectionError("Server connection reset")
    reset.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    assert describe_tls_failure(reset, TLSOptions(), WHERE) is None  # retried: not certain
    hint = describe_tls_reset(reset, TLSOptions())
    assert hint is not None and "may require a client certificate" in hint
    refused = describe_tls_reset(reset, TLSOptions(certfile="/c.pem"))
    assert refused is not None and "may not trust the client certificate /c.pem" in refused
    assert describe_tls_reset(ConnectionRefusedError(111, "refused"), TLSOptions()) is None
    broker = parse_url("amqps://h/", environ={})
    assert broker.unreachable_hint(reset) == hint
    assert broker.unreachable_hint(None) == "is RabbitMQ running and the URL right?"
    plain = parse_url("amqp://h/", environ={})
    assert plain.unreachable_hint(reset) == "is RabbitMQ running and the URL right?"


def test_pikas_reset_in_text_only_hints_at_the_client_certificate() -> None:
    # pika keeps only the text of the SSL EOF: what CI's sync driver saw on 3.10.8
    from pika.exceptions import IncompatibleProtocolError

    error = IncompatibleProtocolError(
        "StreamLostError: (\"Stream connection lost: SSLEOFError(8, 'EOF occurred in "
        "violation of protocol (_ssl.c:2427)')\",)"
    )
    hint = describe_tls_reset(error, TLSOptions())
    assert hint is not None and "may require a client certificate" in hint
    assert describe_tls_reset(IncompatibleProtocolError("AMQP 0-8"), TLSOptions()) is None
