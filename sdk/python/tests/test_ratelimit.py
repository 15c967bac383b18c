"""The RateLimit header fields: both generations read, the draft's parsed strictly."""

from __future__ import annotations

import httpx
import pytest

from quotaplane.ratelimit import (
    MalformedField,
    Policy,
    RateLimit,
    ServiceLimit,
    format_policies,
    from_headers,
    parse_policies,
    parse_service_limits,
)


def test_policies_parse_and_format_round_trip() -> None:
    field = '"user-minute";q=20;w=60, "tokens-org-month";q=5000;qu="tokens", org-day;q=1;w=86400'
    got = parse_policies([field])
    assert got == [Policy("user-minute", 20, 60), Policy("tokens-org-month", 5000, None, "tokens"), Policy("org-day", 1, 86400)]
    assert parse_policies([format_policies(got)]) == got
    assert parse_service_limits(['"user-minute";r=0;t=42']) == [ServiceLimit("user-minute", 0, 42)]
    assert parse_policies(['"a";q=1;pk=:YWJj:']) == [Policy("a", 1, partition_key=b"abc")]
    assert format_policies([Policy('we"ird', 3)]) == '"we\\"ird";q=3'


@pytest.mark.parametrize("field", ['"a";q=-1', '"a";w=60', '"a";q=1;w=0', '"a";q=1;qu=tokens', '"a";q=1,', "(a b);q=1", '"a;q=1', '"a";q=1;pk=x'])
def test_a_malformed_policy_field_is_refused(field: str) -> None:
    with pytest.raises(MalformedField):
        parse_policies([field])


def test_the_legacy_fields_win_and_the_draft_alone_is_read() -> None:
    both = httpx.Headers({"RateLimit-Limit": "20", "RateLimit-Remaining": "3", "RateLimit-Reset": "42",
                          "RateLimit-Policy": '"user-minute";q=20;w=60', "RateLimit": '"user-minute";r=3;t=42'})
    rl, policies = from_headers(both.get_list)
    assert rl == RateLimit(20, 3, 42.0, "user-minute") and len(policies) == 1
    draft = httpx.Headers({"RateLimit-Policy": '"user-minute";q=20;w=60', "RateLimit": '"user-minute";r=3;t=42'})
    assert from_headers(draft.get_list)[0] == RateLimit(20, 3, 42.0, "user-minute")
    broken = httpx.Headers({"RateLimit-Policy": "((", "RateLimit": '"user-minute";r=3'})
    assert from_headers(broken.get_list) == (RateLimit(0, 3, 0.0, "user-minute"), [])
    assert from_headers(httpx.Headers({}).get_list) == (None, [])


def test_times_and_retry_after_as_the_api_writes_them() -> None:
    from datetime import datetime, timedelta, timezone
    from email.utils import format_datetime

    from quotaplane._core import retry_after
    from quotaplane.models import parse_time

    assert parse_time("2026-03-01T12:00:00.123456789Z") == datetime(2026, 3, 1, 12, 0, 0, 123456, timezone.utc)
    assert parse_time("2026-03-01T12:00:00+02:00") == datetime(2026, 3, 1, 10, 0, 0, tzinfo=timezone.utc)
    assert parse_time("not a time") is None
    assert retry_after("7") == 7.0 and retry_after(" 0 ") == 0.0 and retry_after("soon") is None and retry_after(None) is None
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    wait = retry_after(later)
    assert wait is not None and 28 <= wait <= 30
