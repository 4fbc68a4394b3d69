"""A PostgreSQL DSN's password kept out of errors, without garbling them: a short
password ("p") is scrubbed where it shows as a DSN's, not at every "p" of the text."""

from __future__ import annotations

from delayq.stores._postgres_dsn import scrub_dsn


def test_a_short_password_goes_where_it_is_a_dsns_and_the_text_stays_readable() -> None:
    dsn = "postgres://u:p@127.0.0.1:1/db"
    text = f'connection to server at "127.0.0.1", port 1 failed: accepting TCP/IP? {dsn}'
    got = scrub_dsn(text, dsn)
    assert "port 1 failed: accepting" in got and "u:p@" not in got and "u:***@" in got


def test_a_long_password_goes_wherever_it_shows() -> None:
    dsn = "postgresql://u:s3cret-pw@h/db"
    got = scrub_dsn("password=s3cret-pw echo s3cret-pw, user=u", dsn)
    assert got == "password=*** echo ***, user=u"
