"""Verification of the webhooks Quotaplane sends, for Python services that receive them.

Each delivery is a JSON POST whose ``Quotaplane-Signature`` header is::

    t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">

keyed with the org's signing secret (``GET /v1/orgs/{org}/webhook``). :func:`verify`
checks it against the raw body, as received, and refuses a timestamp too far from
now, so a captured delivery cannot be replayed later.

For a day after the org rotates its secret (``POST
/v1/orgs/{org}/webhook/secret/rotate``) a delivery carries two signatures, the new
secret's and the previous one's::

    t=<unix seconds>,v1=<hex, new secret>,v1=<hex, previous secret>

and :func:`verify` accepts it with either secret, so a receiver can switch at any
moment of that day.

This module is the Go client's ``client/webhook`` in Python: the same header, the
same signed payload, the same tolerance and the same three refusals. It needs only
the standard library.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Literal

__all__ = [
    "DEFAULT_TOLERANCE",
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "SIGNATURE_HEADER",
    "WebhookVerificationError",
    "sign",
    "sign_all",
    "verify",
]

SIGNATURE_HEADER = "Quotaplane-Signature"
"""The header of a delivery's signature: ``t=<unix>,v1=<hex>``."""
EVENT_HEADER = "Quotaplane-Event"
"""The header of a delivery's event type, as in the body."""
DELIVERY_HEADER = "Quotaplane-Delivery"
"""The header of a delivery's event id: the same on every retry of one event."""

DEFAULT_TOLERANCE = 300.0
"""How far a signature's timestamp may be from now, in seconds: deliveries are signed
when sent, so an older one is a replay (or a clock far off)."""

WebhookFailure = Literal["malformed", "timestamp", "mismatch"]

_MESSAGES: dict[str, str] = {
    "malformed": "malformed signature header",
    "timestamp": "signature timestamp out of tolerance",
    "mismatch": "signature mismatch",
}

# The timestamp as Go's strconv.ParseInt reads it in base 10: an optional sign and
# ASCII digits, nothing else (no spaces, no underscores), within an int64.
_TIMESTAMP = re.compile(r"[+-]?[0-9]+", re.ASCII)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class WebhookVerificationError(ValueError):
    """A delivery whose signature does not hold.

    ``reason`` says why: ``"malformed"`` (the header has no ``t`` or no ``v1``),
    ``"timestamp"`` (signed too long ago, or in the future: a replay or a clock far
    off) or ``"mismatch"`` (no signature is the secret's for this body). The message
    is the Go client's error text, fit to answer a 401 with.
    """

    reason: WebhookFailure

    def __init__(self, reason: WebhookFailure) -> None:
        super().__init__(_MESSAGES[reason])
        self.reason = reason


def _bytes(data: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    return bytes(data)


def _mac(secret: str | bytes, ts: str, body: bytes) -> str:
    m = hmac.new(_bytes(secret), digestmod=hashlib.sha256)
    m.update(ts.encode("ascii"))
    m.update(b".")
    m.update(body)
    return m.hexdigest()


def _unix(at: float | datetime | None) -> int:
    if at is None:
        return int(time.time())
    if isinstance(at, datetime):
        at = at.timestamp()
    # Go's time.Unix: whole seconds, rounded down (also before 1970).
    return int(at // 1)


def sign(secret: str | bytes, body: bytes | str, at: float | datetime | None = None) -> str:
    """The ``Quotaplane-Signature`` value of ``body`` sent at ``at`` (unix seconds or a
    datetime; default now), keyed with ``secret``: what the worker sends. For testing a
    receiver. A ``str`` body is taken as its UTF-8 bytes."""
    return sign_all([secret], body, at)


def sign_all(secrets: Iterable[str | bytes], body: bytes | str, at: float | datetime | None = None) -> str:
    """The ``Quotaplane-Signature`` value of ``body`` with one ``v1`` signature per
    secret, in order: what the worker sends while an org's previous secret is still
    valid after a rotation. With one secret it is :func:`sign`."""
    ts = str(_unix(at))
    raw = _bytes(body)
    return "t=" + ts + "".join(",v1=" + _mac(s, ts, raw) for s in secrets)


def verify(
    secret: str | bytes,
    header: str | bytes | None,
    body: bytes | bytearray | memoryview | str,
    *,
    now: float | datetime | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> None:
    """Checks ``header``, the value of a delivery's ``Quotaplane-Signature``, against
    ``body`` and the org's signing secret (an ASGI header's ``bytes`` are read as
    Latin-1, as HTTP sends them).

    It returns when one of the header's ``v1`` signatures is ``secret``'s (a delivery
    during a secret rotation carries two) and its timestamp is within ``tolerance``
    seconds of ``now`` (unix seconds or a datetime; default the clock), and raises
    :class:`WebhookVerificationError` otherwise: ``"malformed"`` for a header without
    ``t`` and ``v1``, ``"timestamp"`` for a timestamp out of tolerance,
    ``"mismatch"`` otherwise. ``body`` must be the bytes as received, before any JSON
    decoding; a ``str`` is taken as its UTF-8 bytes. Every signature is compared in
    constant time.
    """
    ts = ""
    sigs: list[str] = []
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    for part in (header or "").split(","):
        k, _, v = part.partition("=")
        if k == "t":
            ts = v
        elif k == "v1" and v != "":
            sigs.append(v)
    if not _TIMESTAMP.fullmatch(ts) or not sigs:
        raise WebhookVerificationError("malformed")
    sec = int(ts)
    if not _INT64_MIN <= sec <= _INT64_MAX:
        raise WebhookVerificationError("malformed")
    if now is None:
        now_s = time.time()
    elif isinstance(now, datetime):
        now_s = now.timestamp()
    else:
        now_s = float(now)
    if abs(now_s - sec) > tolerance:
        raise WebhookVerificationError("timestamp")
    # Signed as sign writes the timestamp: "t=012" is not the "t=12" that was signed.
    canon = str(sec)
    want = _mac(secret, canon, _bytes(body)).encode("ascii")
    ok = False
    for sig in sigs:
        # Every signature is compared (constant time each), not only up to a match.
        if hmac.compare_digest(want, sig.encode("utf-8", "surrogateescape")):
            ok = True
    if not ok or canon != ts:
        raise WebhookVerificationError("mismatch")
