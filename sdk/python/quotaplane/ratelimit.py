"""The RateLimit header fields Quotaplane answers with, read and written.

Quotaplane sends two generations of them (its server's QUOTA_RATELIMIT_HEADERS may turn
either off): the legacy ``RateLimit-Limit``, ``RateLimit-Remaining`` and
``RateLimit-Reset`` (seconds) of the tightest limit, and the structured fields of
draft-ietf-httpapi-ratelimit-headers-11: ``RateLimit-Policy``, one item per limit of
the path (``"user-minute";q=20;w=60``), and ``RateLimit``, the tightest
(``"user-minute";r=0;t=42``). :class:`~quotaplane.RateLimit` is read from the legacy
fields when present, else from the draft's; a malformed draft field is ignored, as the
draft says.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence, Union

__all__ = [
    "Policy",
    "RateLimit",
    "ServiceLimit",
    "MalformedField",
    "parse_policies",
    "parse_service_limits",
    "format_policies",
]


@dataclass(frozen=True)
class RateLimit:
    """What the RateLimit fields of an answer say of the tightest level and window (on
    a denial, the one that refused: ``reset`` is then the Retry-After). ``reset`` is
    in seconds; ``policy`` names the limit as the draft fields do (``user-minute``),
    ``""`` when the answer had no draft field. Computed from the levels when the
    answer had no field at all."""

    limit: int = 0
    remaining: int = 0
    reset: float = 0.0
    policy: str = ""


@dataclass(frozen=True)
class Policy:
    """One item of a RateLimit-Policy field: ``name`` (Quotaplane's:
    ``<level>-<window>``, or ``<metric>-<level>-<window>`` for a metric other than
    requests), ``quota`` (q), ``window`` in seconds (w; None without one: a month, a
    concurrent limit), ``unit`` (qu: "" for requests, ``concurrent-requests`` or the
    metric's name) and ``partition_key`` (pk)."""

    name: str
    quota: int
    window: int | None = None
    unit: str = ""
    partition_key: bytes | None = None


@dataclass(frozen=True)
class ServiceLimit:
    """One item of a RateLimit field: what is left (r) under a policy, and its reset (t, seconds)."""

    name: str
    remaining: int
    reset: int | None = None
    partition_key: bytes | None = None


class MalformedField(ValueError):
    """A RateLimit or RateLimit-Policy field that is not a valid structured-field List of the draft's items."""


class _Token(str):
    """A structured-field Token (as opposed to a String)."""


_BareItem = Union[int, float, str, bytes, bool]

_KEY = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_TOKEN = re.compile(r"[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


class _Parser:
    def __init__(self, s: str) -> None:
        self.s, self.i = s, 0

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def skip(self, chars: str) -> None:
        while self.i < len(self.s) and self.s[self.i] in chars:
            self.i += 1

    def bare(self) -> _BareItem:
        c = self.peek()
        if c == '"':
            self.i += 1
            out = []
            while True:
                if self.i >= len(self.s):
                    raise MalformedField("unterminated string")
                ch = self.s[self.i]
                self.i += 1
                if ch == "\\":
                    if self.i >= len(self.s) or self.s[self.i] not in '"\\':
                        raise MalformedField("bad escape")
                    out.append(self.s[self.i])
                    self.i += 1
                elif ch == '"':
                    return "".join(out)
                elif not (" " <= ch <= "~"):
                    raise MalformedField("bad character in string")
                else:
                    out.append(ch)
        if c == ":":
            end = self.s.find(":", self.i + 1)
            if end < 0:
                raise MalformedField("unterminated byte sequence")
            raw = self.s[self.i + 1 : end]
            self.i = end + 1
            try:
                return base64.b64decode(raw, validate=True)
            except ValueError as e:
                raise MalformedField("bad byte sequence") from e
        if c == "?":
            v = self.s[self.i + 1 : self.i + 2]
            if v not in ("0", "1"):
                raise MalformedField("bad boolean")
            self.i += 2
            return v == "1"
        m = _NUMBER.match(self.s, self.i)
        if m:
            self.i = m.end()
            return float(m.group()) if m.group(1) else int(m.group())
        m = _TOKEN.match(self.s, self.i)
        if m:
            self.i = m.end()
            return _Token(m.group())
        raise MalformedField(f"unexpected {c!r}")

    def params(self) -> dict[str, _BareItem]:
        out: dict[str, _BareItem] = {}
        while self.peek() == ";":
            self.i += 1
            self.skip(" ")
            m = _KEY.match(self.s, self.i)
            if not m:
                raise MalformedField("bad parameter key")
            self.i = m.end()
            val: _BareItem = True
            if self.peek() == "=":
                self.i += 1
                val = self.bare()
            out[m.group()] = val
        return out

    def items(self) -> list[tuple[_BareItem, dict[str, _BareItem]]]:
        out: list[tuple[_BareItem, dict[str, _BareItem]]] = []
        self.skip(" \t")
        if self.i >= len(self.s):
            return out
        while True:
            if self.peek() == "(":
                raise MalformedField("an inner list is not a RateLimit item")
            item = self.bare()
            out.append((item, self.params()))
            self.skip(" \t")
            if self.i >= len(self.s):
                return out
            if self.peek() != ",":
                raise MalformedField("expected ','")
            self.i += 1
            self.skip(" \t")
            if self.i >= len(self.s):
                raise MalformedField("trailing ','")


def _items(values: Iterable[str]) -> list[tuple[_BareItem, dict[str, _BareItem]]]:
    return _Parser(", ".join(v for v in values if v.strip())).items()


def _name(item: _BareItem) -> str:
    if isinstance(item, str):
        return str(item)
    raise MalformedField("an item's name is a string or a token")


def _int(v: _BareItem | None, *, positive: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < (1 if positive else 0):
        raise MalformedField("expected a non-negative integer")
    return v


def _pk(params: Mapping[str, _BareItem]) -> bytes | None:
    pk = params.get("pk")
    if pk is None:
        return None
    if not isinstance(pk, bytes):
        raise MalformedField("pk is a byte sequence")
    return pk


def parse_policies(values: Iterable[str]) -> list[Policy]:
    """Parses a RateLimit-Policy field (every line of it); raises :class:`MalformedField`."""
    out = []
    for item, p in _items(values):
        unit = p.get("qu", "")
        if not isinstance(unit, str) or isinstance(unit, _Token):
            raise MalformedField("qu is a string")
        w = p.get("w")
        out.append(
            Policy(
                name=_name(item),
                quota=_int(p.get("q")),
                window=None if w is None else _int(w, positive=True),
                unit=str(unit),
                partition_key=_pk(p),
            )
        )
    return out


def parse_service_limits(values: Iterable[str]) -> list[ServiceLimit]:
    """Parses a RateLimit field (every line of it); raises :class:`MalformedField`."""
    out = []
    for item, p in _items(values):
        t = p.get("t")
        out.append(
            ServiceLimit(
                name=_name(item),
                remaining=_int(p.get("r")),
                reset=None if t is None else _int(t),
                partition_key=_pk(p),
            )
        )
    return out


def _sf_string(s: str) -> str:
    return '"' + "".join(("\\" + c) if c in '"\\' else c for c in s if " " <= c <= "~") + '"'


def format_policies(policies: Sequence[Policy]) -> str:
    """Writes policies as a RateLimit-Policy field, as Quotaplane sends it, for a
    service that passes Quotaplane's policies on to its own callers."""
    parts = []
    for p in policies:
        s = f"{_sf_string(p.name)};q={p.quota}"
        if p.window:
            s += f";w={p.window}"
        if p.unit:
            s += f";qu={_sf_string(p.unit)}"
        parts.append(s)
    return ", ".join(parts)


def from_headers(get_all: Callable[[str], list[str]]) -> tuple[RateLimit | None, list[Policy]]:
    """The RateLimit of an answer's headers (None without either generation) and its policies."""
    try:
        policies = parse_policies(get_all("RateLimit-Policy"))
    except MalformedField:
        policies = []
    draft: RateLimit | None = None
    try:
        limits = parse_service_limits(get_all("RateLimit"))
    except MalformedField:
        limits = []
    if limits:
        first = limits[0]
        quota = next((p.quota for p in policies if p.name == first.name), 0)
        draft = RateLimit(limit=quota, remaining=first.remaining, reset=float(first.reset or 0), policy=first.name)
    legacy_limit, legacy_rem = get_all("RateLimit-Limit"), get_all("RateLimit-Remaining")
    try:
        limit, remaining = int(legacy_limit[0]), int(legacy_rem[0])
    except (IndexError, ValueError):
        return draft, policies
    reset = _whole_seconds(get_all("RateLimit-Reset"))
    return RateLimit(limit, remaining, reset, draft.policy if draft else ""), policies


def _whole_seconds(values: Sequence[str]) -> float:
    try:
        n = int(values[0].strip())
    except (IndexError, ValueError):
        return 0.0
    return float(max(n, 0))
