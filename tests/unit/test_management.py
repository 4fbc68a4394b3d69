"""The management API client without a server: URLs, their defaults, and redaction."""

from __future__ import annotations

import pytest

from delayq.errors import InvalidURL
from delayq.ops.management import ManagementAPI, management_url_for


def test_derived_from_the_amqp_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYQ_MANAGEMENT_URL", raising=False)
    assert management_url_for("amqp://app:s3cret@rabbit.example:5672/prod") == (
        "http://app:s3cret@rabbit.example:15672/",
        False,
    )
    assert management_url_for("amqps://app:pw@rabbit:5671/") == (
        "https://app:pw@rabbit:15671/",
        False,
    )
    assert management_url_for("amqp://[::1]:5672/") == ("http://[::1]:15672/", False)


def test_a_url_of_several_hosts_gets_its_first_hosts_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``http://u:p@rabbit1,rabbit2,rabbit3:15672/``, a host no request can reach."""
    monkeypatch.delenv("DELAYQ_MANAGEMENT_URL", raising=False)
    assert management_url_for("amqp://u:p@rabbit1,rabbit2,rabbit3:5672/vh") == (
        "http://u:p@rabbit1:15672/",
        False,
    )
    assert management_url_for("amqps://u:p@r1:5671,r2:5671/") == ("https://u:p@r1:15671/", False)


def test_explicit_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYQ_MANAGEMENT_URL", "http://env:pw@h:1/")
    assert management_url_for("amqp://a:b@h/") == ("http://env:pw@h:1/", True)
    assert management_url_for("amqp://a:b@h/", "http://x:y@z:2/") == ("http://x:y@z:2/", True)


@pytest.mark.parametrize(
    "url", ["amqp://guest:s3cret@h:15672/", "h:15672", "http://guest:s3cret@h:notaport/", "http://"]
)
def test_a_bad_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(InvalidURL) as info:
        ManagementAPI(url)
    assert "s3cret" not in str(info.value)


def test_repr_and_url_hide_the_password() -> None:
    api = ManagementAPI("http://admin:s3cret@h:15672/prefix/")
    assert "s3cret" not in repr(api) and "s3cret" not in api.url
    assert api.url == "http://admin:***@h:15672/prefix/"
