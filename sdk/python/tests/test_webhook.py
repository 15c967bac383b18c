"""quotaplane.webhook against Go's package webhook: its test's vectors, what Go's Sign
and Verify answer case by case, and a delivery signed by a real quotaplane-worker."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from quotaplane import webhook
from quotaplane.webhook import WebhookVerificationError

REPO = Path(__file__).resolve().parents[3]


def reason(secret, header, body, **kw) -> str:
    try:
        webhook.verify(secret, header, body, **kw)
        return "ok"
    except WebhookVerificationError as e:
        return e.reason


SECRET = "3af2fb1d0c5e4a8f9b7d6c5e4a3b2c1d"
BODY = b'{"id":17,"type":"usage.threshold","org":"demo"}'
SENT = 1763700000
HEADER = webhook.sign(SECRET, BODY, SENT)
V1 = HEADER.removeprefix(f"t={SENT},v1=")
ZEROS, ONES = "0" * 64, "1" * 64
ROTATED = webhook.sign_all([SECRET, "previous-secret"], BODY, SENT)

# The cases of client/webhook/webhook_test.go, one for one.
GO_CASES = [
    ("as sent", SECRET, HEADER, BODY, SENT, "ok"),
    ("4 minutes later", SECRET, HEADER, BODY, SENT + 240, "ok"),
    ("clock 4 minutes behind", SECRET, HEADER, BODY, SENT - 240, "ok"),
    ("fields in another order", SECRET, f"v1={V1},t={SENT}", BODY, SENT, "ok"),
    ("replayed 6 minutes later", SECRET, HEADER, BODY, SENT + 360, "timestamp"),
    ("timestamp moved", SECRET, f"t={SENT + 300},v1={V1}", BODY, SENT + 300, "mismatch"),
    ("timestamp with a leading zero", SECRET, f"t=0{SENT},v1={V1}", BODY, SENT, "mismatch"),
    ("another org's secret", "another-secret", HEADER, BODY, SENT, "mismatch"),
    ("body changed", SECRET, HEADER, BODY.replace(b"demo", b"evil"), SENT, "mismatch"),
    ("body re-encoded", SECRET, HEADER, b'{"id": 17, "type": "usage.threshold", "org": "demo"}', SENT, "mismatch"),
    ("signature truncated", SECRET, HEADER[:-2], BODY, SENT, "mismatch"),
    ("two signatures, this secret's first", SECRET, f"t={SENT},v1={V1},v1={ZEROS}", BODY, SENT, "ok"),
    ("two signatures, this secret's second", SECRET, f"t={SENT},v1={ZEROS},v1={V1}", BODY, SENT, "ok"),
    ("sign_all, new secret", SECRET, ROTATED, BODY, SENT, "ok"),
    ("sign_all, previous secret", "previous-secret", ROTATED, BODY, SENT, "ok"),
    ("sign_all, a third secret", "another-secret", ROTATED, BODY, SENT, "mismatch"),
    ("two signatures, neither this secret's", SECRET, f"t={SENT},v1={ZEROS},v1={ONES}", BODY, SENT, "mismatch"),
    ("empty header", SECRET, "", BODY, SENT, "malformed"),
    ("no header", SECRET, None, BODY, SENT, "malformed"),
    ("no signature", SECRET, f"t={SENT}", BODY, SENT, "malformed"),
    ("no timestamp", SECRET, f"v1={V1}", BODY, SENT, "malformed"),
    ("timestamp not a number", SECRET, f"t=soon,v1={V1}", BODY, SENT, "malformed"),
    ("timestamp with underscores", SECRET, f"t=1_763_700_000,v1={V1}", BODY, SENT, "malformed"),
    ("timestamp with a space", SECRET, f"t= {SENT},v1={V1}", BODY, SENT, "malformed"),
    ("timestamp in other digits", SECRET, f"t=١٧٦٣٧٠٠٠٠٠,v1={V1}", BODY, SENT, "malformed"),
    ("timestamp past int64", SECRET, f"t=99999999999999999999,v1={V1}", BODY, SENT, "malformed"),
    ("header as ASGI bytes", SECRET, HEADER.encode("latin-1"), BODY, SENT, "ok"),
    ("body as str", SECRET, HEADER, BODY.decode(), SENT, "ok"),
]


@pytest.mark.parametrize("name,secret,header,body,now,want", GO_CASES, ids=[c[0] for c in GO_CASES])
def test_verify_go_vectors(name, secret, header, body, now, want):
    assert reason(secret, header, body, now=now) == want


def test_sign():
    assert HEADER.startswith(f"t={SENT},v1=") and len(V1) == 64
    assert webhook.sign_all([SECRET], BODY, SENT) == HEADER
    assert webhook.sign(SECRET, BODY.decode(), SENT) == HEADER
    assert webhook.sign(SECRET.encode(), BODY, datetime.fromtimestamp(SENT + 0.9, timezone.utc)) == HEADER
    assert ROTATED == f"{HEADER},v1={webhook.sign('previous-secret', BODY, SENT).split('v1=')[1]}"
    now = time.time()
    assert reason(SECRET, webhook.sign(SECRET, BODY), BODY) == "ok"  # signed now, verified now
    assert reason(SECRET, webhook.sign(SECRET, BODY), BODY, now=now + 301) == "timestamp"
    assert reason(SECRET, HEADER, BODY, now=SENT + 30, tolerance=10) == "timestamp"
    assert reason(SECRET, HEADER, BODY, now=datetime.fromtimestamp(SENT + 60, timezone.utc)) == "ok"
    err = pytest.raises(WebhookVerificationError, webhook.verify, SECRET, HEADER, b"{}", now=SENT)
    assert str(err.value) == "signature mismatch" and isinstance(err.value, ValueError)


def go_answers(cases: list[dict]) -> list[dict]:
    """What Go's webhook.Sign and webhook.Verify answer for each case (the TypeScript
    SDK's sdk/typescript/test/testdata/gosign)."""
    lines = "".join(json.dumps({**c, "body": base64.b64encode(c["body"]).decode()}) + "\n" for c in cases)
    out = subprocess.run(
        ["go", "run", "./sdk/typescript/test/testdata/gosign"],
        cwd=REPO, input=lines, capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_agrees_with_go_case_by_case():
    now_ms = int(time.time() * 1000)
    t = now_ms // 1000
    cases: list[dict] = []

    def add(secret: str, body: bytes, header, now=now_ms, at=t):
        h = webhook.sign(secret, body, at)
        cases.append({"secret": secret, "body": body, "sign_at": at, "header": header(h, h.split("v1=")[1]), "now_ms": now})

    js = '{"id":17,"type":"usage.threshold","org":"demo","data":{"note":"é ✓"}}'.encode()
    for secret, body in [(SECRET, js), ("sécret ✓", os.urandom(512)), ("k", b"")]:
        add(secret, body, lambda h, s: h)
        add(secret, body, lambda h, s: h, now_ms + 299_000)
        add(secret, body, lambda h, s: h, t * 1000 + 300_000)  # exactly the tolerance
        add(secret, body, lambda h, s: h, t * 1000 - 300_000)
        add(secret, body, lambda h, s: h, now_ms + 301_000)
        add(secret, body, lambda h, s: h, now_ms - 301_000)
        add(secret, body, lambda h, s: f"v1={s},t={t}")
        add(secret, body, lambda h, s: f"{h},v0=deadbeef")
        add(secret, body, lambda h, s: f"t={t},v1={s.upper()}")
        add(secret, body, lambda h, s: f"t=+{t},v1={s}")
        add(secret, body, lambda h, s: f"t=0{t},v1={s}")
        add(secret, body, lambda h, s: f"t={t - 1},v1={s}")
        add(secret, body, lambda h, s: f"t={t},v1={s[:-1]}")
        add(secret, body, lambda h, s: f"t={t},t={t + 1},v1={s}")
        add(secret, body, lambda h, s: f"t={t},v1={s},v1={ZEROS}")
        add(secret, body, lambda h, s: f"t={t},v1={ZEROS},v1={s}")
        add(secret, body, lambda h, s: f"t={t},v1={s},v1=")
        add(secret, body, lambda h, s: f"t={t},v1={ZEROS},v1={ONES}")
        add(secret + "x", body, lambda h, s, secret=secret, body=body: webhook.sign(secret, body, t))
    for header in ["", "t=", "v1=abc", f"t={t}", f"t={t},v1=", "t=abc,v1=ab", "t=99999999999999999999,v1=ab",
                   "t=-9223372036854775809,v1=ab", "t=-5,v1=ab", "garbage", f"t ={t},v1=ab", f"t=1_0,v1=ab"]:
        cases.append({"secret": "s", "body": js, "sign_at": t, "header": header, "now_ms": now_ms})
    tampered = bytearray(js)
    tampered[10] ^= 1
    cases.append({"secret": "s", "body": bytes(tampered), "sign_at": t, "header": webhook.sign("s", js, t), "now_ms": now_ms})

    go = go_answers(cases)
    assert len(go) == len(cases)
    for i, (c, g) in enumerate(zip(cases, go)):
        assert webhook.sign(c["secret"], c["body"], c["sign_at"]) == g["signed"], f"case {i}: sign"
        got = reason(c["secret"], c["header"], c["body"], now=c["now_ms"] / 1000)
        assert got == g["verify"], f"case {i}: header {c['header']!r}"
    assert {g["verify"] for g in go} == {"ok", "malformed", "timestamp", "mismatch"}, "the cases cover every answer"


def test_a_delivery_from_a_real_worker(stack):
    """An org whose webhook_url is a local receiver: the worker's usage.threshold
    delivery verifies with the org's signing secret, and not once changed."""
    import http.server
    import threading

    import quotaplane

    deliveries: list[tuple[dict[str, str], bytes]] = []
    got = threading.Event()

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            deliveries.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()
            got.set()

        def log_message(self, *args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        org = stack.org([{"metric": "requests", "window": "month", "limit": 10}])
        url = f"http://127.0.0.1:{srv.server_address[1]}/hooks/quotaplane"
        stack.api("PATCH", f"/v1/orgs/{org.id}", {"webhook_url": url}, token=org.key)
        info = stack.api("GET", f"/v1/orgs/{org.id}/webhook", token=org.key)
        assert info["signature_header"] == webhook.SIGNATURE_HEADER
        secret = info["signing_secret"]
        assert secret, info

        # 9 of 10 a month: past 80 %, so the worker sends usage.threshold when it next persists usage.
        with quotaplane.Client(stack.base_url, org.key) as c:
            assert c.check(org.id, cost=9).allowed
        assert got.wait(30), "no delivery in 30 s:\n" + stack.procs[-1].log()

        headers, body = deliveries[0]
        header = headers[webhook.SIGNATURE_HEADER.lower()]
        assert header.startswith("t=") and len(header.split(",v1=")[1]) == 64, header
        assert headers[webhook.EVENT_HEADER.lower()] == "usage.threshold"
        assert headers[webhook.DELIVERY_HEADER.lower()].isdigit()
        webhook.verify(secret, header, body)
        webhook.verify(secret, header.encode("latin-1"), body.decode())  # as ASGI and a str give them
        event = json.loads(body)
        assert (event["type"], event["org"]) == ("usage.threshold", org.id)

        assert reason(secret, header, body.replace(org.id.encode(), b"evil")) == "mismatch"
        assert reason(secret + "x", header, body) == "mismatch"
        assert reason(secret, header, body, now=time.time() + 600) == "timestamp"
        assert reason(secret, None, body) == "malformed"
    finally:
        srv.shutdown()
        srv.server_close()
