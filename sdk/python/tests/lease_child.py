"""A client process with leases for tests/test_leases.py: checks one user's path as
fast as it can and reports on stdout, as it happens, each admission (``A 1`` leased,
``A 0`` by the server), each lease granted (``G id units settle_by``) and settled
(``S id``). Arguments: base URL, key, org, user, role, team.

- ``survivor``: runs until 100 checks in a row were denied (or 30 s), closes the
  client (settling every lease) and prints ``CLOSED``.
- ``victim``: after 300 admissions, at a leased admission with a lease taken less than
  half its life ago, prints ``HOLD`` and waits for its SIGKILL: nothing of its own is
  in flight then (the caller's thread sends lease requests), its lease is open."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

import quotaplane  # noqa: E402

base, key, org, user, role, team = sys.argv[1:7]
out = threading.Lock()
granted_at = 0.0
life = 0.0


def say(line: str) -> None:
    with out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def grant(d: object) -> None:
    global granted_at, life
    if isinstance(d, dict) and d.get("units"):
        granted_at, life = time.monotonic(), d.get("ttl_ms", 0) / 1000
        say(f"G {d['id']} {d['units']} {d['settle_by']}")


def seen(r: httpx.Response) -> None:
    path = r.request.url.path
    if not path.startswith("/v1/leases") or r.status_code not in (200, 201):
        return
    r.read()
    d = r.json()
    if path.endswith("/settle"):
        say(f"S {path.split('/')[3]}")
        grant(d.get("next"))
    else:
        grant(d)


http = httpx.Client(event_hooks={"response": [seen]})
c = quotaplane.Client(base, key, http_client=http, leases=True, budget=5, fail_policy=None)
admitted = denied_in_a_row = 0
end = time.monotonic() + 30
while time.monotonic() < end:
    r = c.check(org, team=team, user=user)
    if not r.allowed:
        denied_in_a_row += 1
        if role == "survivor" and denied_in_a_row >= 100:
            break
        continue
    denied_in_a_row = 0
    admitted += 1
    say(f"A {int(r.leased)}")
    if role == "victim" and admitted >= 300 and r.leased and time.monotonic() - granted_at < life / 2:
        say("HOLD")
        sys.stdin.readline()
c.close()
say("CLOSED")
