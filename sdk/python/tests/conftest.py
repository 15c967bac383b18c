from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package as checked out
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack import Stack  # noqa: E402


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    s = Stack()
    try:
        yield s
    finally:
        s.stop()
