"""The tests' Quotaplane: quotaplane-api and quotaplane-worker built from this checkout
with ``go build`` and started on a Postgres database of their own (created by the api
at start, dropped at the end) with the demo org `make run` seeds, on the Redis of
REDIS_URL under a key prefix of their own, on free ports, with a fresh operator token. Every test makes its own plan and org with random ids, so nothing it
counts is seen by another test or another run."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx


def repo_root() -> Path:
    d = Path(__file__).resolve().parent
    while not ((d / "go.mod").exists() and (d / "cmd" / "api").is_dir()):
        if d.parent == d:
            raise RuntimeError(f"stack: no repository root (go.mod, cmd/api) above {__file__}")
        d = d.parent
    return d


SDK = Path(__file__).resolve().parent.parent
BIN = SDK / "build" / "bin"


def random_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


def build(name: str) -> Path:
    """The binary name built from this checkout into sdk/python/build/bin (go build
    relinks only what changed)."""
    pkg = {"quotaplane-api": "./cmd/api", "quotaplane-worker": "./cmd/worker"}[name]
    out = BIN / name
    subprocess.run(["go", "build", "-o", str(out), pkg], cwd=repo_root(), check=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """The environment without the binaries' own settings, so a developer's cannot leak in."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("QUOTA_") and k not in ("DATABASE_URL", "REDIS_URL", "REDIS_CLUSTER")
    }


class Proc:
    def __init__(self, path: Path, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")
        self.p = subprocess.Popen([str(path)], env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._log.close()


def wait_for(url: str, proc: Proc, what: str) -> None:
    deadline = time.monotonic() + 60
    last = ""
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            raise RuntimeError(f"stack: {what} exited ({proc.p.returncode}):\n{proc.log()}")
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200:
                return
            last = f"answered {r.status_code}"
        except httpx.HTTPError as e:
            last = str(e)
        time.sleep(0.1)
    raise RuntimeError(f"stack: {what} not ready at {url}: {last}\n{proc.log()}")


@dataclass
class Org:
    """An org on a plan of its own, and an org key with the check, admin and billing scopes."""

    id: str
    key: str
    plan: str


class Stack:
    """A running quotaplane-api and quotaplane-worker on a fresh database."""

    def __init__(self, worker: bool = True) -> None:
        admin = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
        self.admin_url = admin
        self.db_name = "qp_py_" + secrets.token_hex(5)
        u = urlsplit(admin)
        self.database_url = urlunsplit((u.scheme, u.netloc, "/" + self.db_name, u.query, u.fragment))
        self.redis_url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
        self.operator_token = "py-op-" + secrets.token_hex(12)
        self.webhook_secret = "py-webhook-" + secrets.token_hex(12)
        BIN.mkdir(parents=True, exist_ok=True)
        api_bin = build("quotaplane-api")
        worker_bin = build("quotaplane-worker") if worker else None
        addr = f"127.0.0.1:{free_port()}"
        self.base_url = f"http://{addr}"
        env = {
            **clean_env(),
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "QUOTA_ADMIN_TOKEN": self.operator_token,
            "QUOTA_WEBHOOK_SECRET": self.webhook_secret,
            "QUOTA_LOG_LEVEL": "warn",
            "QUOTA_STARTUP_TIMEOUT": "20s",
            "QUOTA_FLUSH_INTERVAL": "200ms",
            "QUOTA_WEBHOOK_ALLOW_PRIVATE": "true",
            # A machine busy with other builds can stall Redis past the 100 ms default.
            "QUOTA_REDIS_TIMEOUT": "2s",
            # Every key of this stack under a prefix of its own: the demo org's fixed
            # ids cannot meet another run's on the shared Redis.
            "QUOTA_REDIS_PREFIX": "py" + secrets.token_hex(6),
        }
        self.procs: list[Proc] = []
        # The demo org `make run` seeds (its key is demo_key), for the README's examples.
        with tempfile.TemporaryDirectory(prefix="quotaplane-py-demo-") as state:
            subprocess.run([str(api_bin), "demo", "--state-dir", state], env=env, check=True, capture_output=True)
            self.demo_key = (Path(state) / "demo-org-key").read_text().strip()
        try:
            # The api first: it creates and migrates the database the worker then uses.
            api = Proc(api_bin, {**env, "QUOTA_HTTP_ADDR": addr, "QUOTA_GRPC_ADDR": "127.0.0.1:0"}, BIN.parent / "api.log")
            self.procs.append(api)
            wait_for(self.base_url + "/readyz", api, "quotaplane-api")
            if worker_bin is not None:
                waddr = f"127.0.0.1:{free_port()}"
                w = Proc(worker_bin, {**env, "QUOTA_WORKER_HTTP_ADDR": waddr}, BIN.parent / "worker.log")
                self.procs.append(w)
                wait_for(f"http://{waddr}/healthz", w, "quotaplane-worker")
        except BaseException:
            self.stop()
            raise
        self.http = httpx.Client(base_url=self.base_url, timeout=10)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        if hasattr(self, "http"):
            self.http.close()
        subprocess.run(
            ["psql", self.admin_url, "-q", "-c", f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
        )

    def api(self, method: str, path: str, body: Any = None, token: str | None = None, want: Sequence[int] = (200, 201, 204)) -> Any:
        """Calls the API with the operator token (or token), failing on any status but want."""
        r = self.http.request(method, path, json=body, headers={"Authorization": f"Bearer {token or self.operator_token}"})
        if r.status_code not in want:
            raise AssertionError(f"{method} {path}: {r.status_code} {r.text}")
        return r.json() if r.content else None

    def org(
        self,
        limits: Sequence[dict[str, Any]],
        *,
        fail_mode: str = "closed",
        metered: Sequence[str] | None = None,
        features: dict[str, Any] | None = None,
    ) -> Org:
        """A plan with limits and an org on it with a team "eng", and a key: fresh ids, so
        each test counts alone."""
        plan, org = random_id("plan"), random_id("org")
        p: dict[str, Any] = {"id": plan, "name": plan, "fail_mode": fail_mode, "limits": list(limits)}
        if metered:
            p["metered"] = list(metered)
        if features:
            p["features"] = features
        self.api("POST", "/v1/plans", p)
        self.api("POST", "/v1/orgs", {"id": org, "name": org, "plan": plan})
        self.api("POST", f"/v1/orgs/{org}/teams", {"id": "eng", "name": "eng"})
        key = self.api("POST", f"/v1/orgs/{org}/api-keys", {"name": "sdk-test", "scopes": ["check", "admin", "billing"]})
        if any(lim.get("window") == "minute" for lim in limits):
            clear_of_minute_edge()
        return Org(org, key["secret"], plan)


def clear_of_minute_edge() -> None:
    """Waits, when fewer than 10 s of the current minute are left, for the next minute:
    a sliding minute window weighs the previous bucket by the part of it still inside
    the window, rounded down, so a test that counts exact remaining units across the
    edge would see one more."""
    left = 60 - (time.time() % 60)
    if left < 10:
        time.sleep(left + 0.05)
