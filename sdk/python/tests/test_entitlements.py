"""Entitlements against a real api."""

from __future__ import annotations

import time

import pytest

import quotaplane
from stack import Stack


def test_entitlements_feature_and_entitled(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 10}], features={"sso": True, "seats": 25, "tier": "gold", "audit": False})
    stack.api("PUT", f"/v1/orgs/{o.id}/features", {"features": {"seats": 50}})
    with quotaplane.Client(stack.base_url, o.key) as c:
        deadline = time.monotonic() + 3  # an override reaches every replica within a second
        while (e := c.entitlements(o.id)).features.get("seats") != 50 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert e.org == o.id
        assert dict(e.features) == {"sso": True, "seats": 50, "tier": "gold", "audit": False}
        assert e.sources["seats"] == "org" and e.sources["sso"] == "plan"
        assert c.feature(o.id, "tier") == "gold" and c.feature(o.id, "nope") is None
        assert c.entitled(o.id, "sso") and c.entitled(o.id, "seats") and not c.entitled(o.id, "audit")
        assert not c.entitled(o.id, "nope")
        assert c.entitlements(o.id, team="eng").team == "eng"
        with pytest.raises(quotaplane.NotFound):
            c.entitlements(o.id, team="nope")


async def test_async_entitlements(stack: Stack) -> None:
    o = stack.org([{"metric": "requests", "window": "day", "limit": 10}], features={"sso": True})
    async with quotaplane.AsyncClient(stack.base_url, o.key) as c:
        assert await c.entitled(o.id, "sso")
        assert await c.feature(o.id, "sso", team="eng") is True
