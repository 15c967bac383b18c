"""README.md as a test: every ```python block runs as printed, in page order, against
the real api with the demo org (QUOTAPLANE_URL and QUOTAPLANE_KEY set as the page says),
in a fresh directory, and prints what the ```text block under it shows (line by line;
``...`` stands for any text)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stack import SDK, Stack

BLOCK = re.compile(r"```python\n(.*?)```\n(?:\s*\n)*(?:```text\n(.*?)```)?", re.S)


def examples() -> list[tuple[str, str, str | None]]:
    """(the section's heading, the code, the output shown) of each python block."""
    text = (SDK / "README.md").read_text()
    out = []
    for m in BLOCK.finditer(text):
        heading = re.findall(r"^## (.+)$", text[: m.start()], re.M)[-1]
        out.append((heading, m.group(1), m.group(2)))
    return out


def matches(want: str, got: str) -> bool:
    w, g = want.rstrip("\n").split("\n"), got.rstrip("\n").split("\n")
    return len(w) == len(g) and all(
        re.fullmatch(".*".join(re.escape(part) for part in wl.split("...")), gl) for wl, gl in zip(w, g)
    )


def test_every_section_of_the_readme_has_examples() -> None:
    headings = {h for h, _, _ in examples()}
    assert len(examples()) >= 9
    for h in ("The first check", "Reservations", "asyncio", "Time, retries and the fail policy", "Errors",
              "Entitlements", "Testing without Quotaplane"):
        assert h in headings, h


def test_the_first_check_takes_at_most_five_lines() -> None:
    _, code, _ = examples()[0]
    assert len([line for line in code.splitlines() if line.strip()]) <= 5, code


def test_the_readmes_examples_run_as_printed(stack: Stack, tmp_path: Path) -> None:
    env = {**os.environ, "QUOTAPLANE_URL": stack.base_url, "QUOTAPLANE_KEY": stack.demo_key, "PYTHONPATH": str(SDK)}
    for i, (heading, code, want) in enumerate(examples()):
        path = tmp_path / f"example{i}.py"
        path.write_text(code)
        p = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, f"## {heading}, example {i}:\n{code}\n{p.stderr}"
        if want is not None and not matches(want, p.stdout):
            pytest.fail(f"## {heading}, example {i} printed:\n{p.stdout}\nthe README shows:\n{want}")
