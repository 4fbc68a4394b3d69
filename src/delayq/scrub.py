"""Credentials taken out of error text before it leaves the process.

A handler's exception often quotes what it was using: a database URL with its
password, a request's ``Authorization`` header, an API key. Both consumers put
the error's message and traceback in the DLQ and retry headers, in the
delivery's ``reason`` (worker logs, delivery records, observers); every one of
those passes through :func:`scrub` first (see
:class:`~delayq.consume.planner.DeliveryPlanner`). What it replaces with ``***``:

- the password of a URL: ``scheme://user:secret@host`` becomes
  ``scheme://user:***@host`` (any scheme; the user name stays, as in
  :func:`delayq.urls.redact`);
- the value after a sensitive key, in ``key=value``, ``key: value``, JSON
  ``"key": "value"`` and Python ``'key': 'value'`` forms, the key matched
  anywhere in a word (``PGPASSWORD=``, ``db_password:``, ``X-Api-Key:``): keys
  containing ``password``, ``passwd``, ``pwd``, ``secret``, ``token``,
  ``api_key``/``apikey``, ``access_key``, ``private_key``, ``credential``,
  ``authorization``, ``cookie``, ``session``, ``signature`` (a quoted value
  cut off before its closing quote is masked to the end of its line);
- the credentials of an ``Authorization`` scheme: ``Bearer <token>``,
  ``Basic <base64>``, ``Token <token>`` (8 characters or more);
- tokens recognisable by their form: AWS access key ids (``AKIA...``),
  GitHub (``ghp_...``, ``github_pat_...``), Slack (``xoxb-...``), Stripe
  (``sk_live_...``), Google API keys (``AIza...``), JSON Web Tokens
  (``eyJ...``), and PEM private key blocks.

It cannot know every secret: a password printed on its own (``login failed
for hunter2``) stays. Add a scrubber of your own (``scrubber=`` on
``Consumer``, ``AsyncConsumer`` or ``Worker``): it runs on the text after
this one.

>>> scrub("cannot connect to postgresql://app:s3cret@db/orders")
'cannot connect to postgresql://app:***@db/orders'
>>> scrub("headers={'Authorization': 'Bearer abc.def.ghi', 'X-Api-Key': 'k-123'}")
"headers={'Authorization': 'Bearer ***', 'X-Api-Key': '***'}"
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

__all__ = ["MASK", "SCRUB_WINDOW_CHARS", "Scrubber", "scrub", "scrubbing"]

log = logging.getLogger("delayq.scrub")

MASK = "***"

Scrubber = Callable[[str], str]
"""A function that takes text and returns it without the secrets it knows of."""

SCRUB_WINDOW_CHARS = 65_536
"""At most this much of an error's text is scrubbed (the head of a message, the
tail of a traceback); the headers keep far less (1 KiB and 8 KiB), so a secret
cut in two at the window's edge never reaches them."""

# Every quantifier is bounded or anchored on a literal, so scrubbing stays linear
# in the text's length (a 1 MB message of one word included).
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/@'\"<>]{0,256}:)"
    r"(?P<secret>[^\s'\"<>]{1,256})(?=@)",
)
"""``scheme://user:`` then the password, up to the last ``@`` of the word (a password
may hold an unencoded ``@``)."""

_KEY_WORDS = (
    r"password|passwd|pwd|secret|token|api[_\-]?key|access[_\-]?key|private[_\-]?key"
    r"|credential|authorization|cookie|session|signature"
)
_KEY_VALUE = re.compile(
    r"(?P<key>(?:" + _KEY_WORDS + r")[A-Za-z0-9_\-]{0,40})"
    r"(?P<close>[\"']?)(?P<sep>[ \t]{0,5}[:=][ \t]{0,5})"
    # A quoted value ends at its closing quote, or at the end of the line when cut off.
    r"(?:(?P<quote>[\"'])(?P<quoted>(?:(?!(?P=quote))[^\r\n]){0,4096})(?:(?P=quote)|(?=[\r\n]|\Z))"
    r"|(?P<bare>(?:(?:Bearer|Basic|Token|Digest|Negotiate)[ \t]{1,5})?"
    r"[^\s,;&\"'}\])<>]{1,4096}))",
    re.IGNORECASE,
)
_AUTH_SCHEME = re.compile(
    r"\b(?P<scheme>Bearer|Basic|Token|Digest|Negotiate)(?P<space>[ \t]{1,5})"
    r"(?P<secret>[A-Za-z0-9\-._~+/]{8,4096}=*)",
    re.IGNORECASE,
)
_TOKENS = re.compile(
    r"\b(?:"
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}"  # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255}"  # GitHub
    r"|xox[abprs]-[A-Za-z0-9\-]{10,255}"  # Slack
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,255}"  # Stripe
    r"|AIza[0-9A-Za-z\-_]{35}"  # Google API keys
    r"|eyJ[A-Za-z0-9_\-]{5,4096}\.eyJ[A-Za-z0-9_\-]{5,4096}\.[A-Za-z0-9_\-]{0,4096}"  # JWT
    r")"
)
_PRIVATE_KEY = re.compile(
    r"(?P<begin>-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----)"
    r"(?:[\s\S]*?(?P<end>-----END [A-Z ]{0,40}PRIVATE KEY-----)|[\s\S]*)"  # or cut off
)


_MASKED_SCHEME = re.compile(
    r"(?:(?:Bearer|Basic|Token|Digest|Negotiate)[ \t]{1,5})?\*\*\*", re.IGNORECASE
)
"""A value already masked (``***``, or ``Bearer ***`` by :data:`_AUTH_SCHEME`)."""


def _key_value(match: re.Match[str]) -> str:
    value = match.group("quoted") if match.group("quote") else match.group("bare")
    if not value or _MASKED_SCHEME.fullmatch(value):
        return match.group(0)
    start, end = match.span("quoted" if match.group("quote") else "bare")
    offset = match.start()
    whole = match.group(0)
    return whole[: start - offset] + MASK + whole[end - offset :]


def scrub(text: str) -> str:
    """``text`` with the credentials delayq recognises replaced by ``***`` (see above)."""
    if not text:
        return text
    text = _PRIVATE_KEY.sub(lambda m: m.group("begin") + MASK + (m.group("end") or ""), text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _AUTH_SCHEME.sub(lambda m: m.group("scheme") + m.group("space") + MASK, text)
    text = _TOKENS.sub(MASK, text)
    return _KEY_VALUE.sub(_key_value, text)


def scrubbing(user: Scrubber | None) -> Scrubber:
    """The scrubber a consumer applies: :func:`scrub`, then ``user``'s when given.

    A user scrubber that raises, or returns something other than a string, is
    logged (its type and the error's type only: its message may hold the very
    secret) and the default scrubbing stands alone.
    """
    if user is None:
        return scrub
    if not callable(user):
        from delayq.errors import InvalidInput

        raise InvalidInput(f"scrubber must be a callable taking and returning str, not {user!r}")

    def both(text: str) -> str:
        cleaned = scrub(text)
        try:
            result = user(cleaned)
        except Exception as exc:
            log.warning(
                "the scrubber %r failed (%s); the error text keeps the default scrubbing only",
                user,
                type(exc).__name__,
            )
            return cleaned
        if not isinstance(result, str):
            log.warning(
                "the scrubber %r returned %s, not str; the error text keeps the default "
                "scrubbing only",
                user,
                type(result).__name__,
            )
            return cleaned
        return result

    return both
