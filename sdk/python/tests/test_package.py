"""The README's install commands, run as printed in a copy of the clone: the package
builds with the backend of pyproject.toml and installs with pip, offline, into a fresh
venv, where the README's first example runs against the installed package (not the
checkout). The sdist and wheel the backend builds carry the metadata pip resolves
with for a user with an index."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from stack import SDK, Stack, repo_root
from test_readme import examples


def install_commands() -> str:
    text = (SDK / "README.md").read_text()
    section = text[text.index("## Install\n") : text.index("## The first check\n")]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2 and blocks[0].strip() == "pip install quotaplane", blocks
    return blocks[1]


def clone(dst: Path) -> Path:
    """The SDK's files as git has them (committed or not, not ignored), at their place in a clone."""
    root = repo_root()
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "sdk/python"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split("\0")
    assert "sdk/python/pyproject.toml" in files
    for f in filter(None, files):
        if (root / f).exists():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, dst / f)
    return dst


def test_the_install_commands_work_as_printed_in_a_fresh_venv(stack: Stack, tmp_path: Path) -> None:
    repo = clone(tmp_path / "quotaplane")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_INDEX_URL")}
    env["PIP_NO_INDEX"] = "1"  # prove nothing is fetched
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # python3 is this interpreter
    subprocess.run(["bash", "-euo", "pipefail", "-c", install_commands()], cwd=repo, env=env, check=True,
                   capture_output=True, timeout=300)
    py = repo / ".venv" / "bin" / "python"
    app = tmp_path / "app"
    app.mkdir()
    where = subprocess.run([str(py), "-c", "import quotaplane; print(quotaplane.__file__, quotaplane.__version__)"],
                           cwd=app, env=env, capture_output=True, text=True, check=True).stdout
    assert "/.venv/lib/" in where and "site-packages/quotaplane/" in where and where.split()[1] == "0.1.0", where
    typed = subprocess.run([str(py), "-c", "import importlib.resources as r; print(r.files('quotaplane').joinpath('py.typed').is_file())"],
                           cwd=app, env=env, capture_output=True, text=True, check=True).stdout
    assert typed.strip() == "True"
    _, first, want = examples()[0]
    (app / "first.py").write_text(first)
    out = subprocess.run([str(py), "first.py"], cwd=app, capture_output=True, text=True, timeout=60,
                         env={**env, "QUOTAPLANE_URL": stack.base_url, "QUOTAPLANE_KEY": stack.demo_key})
    assert out.returncode == 0, out.stderr
    assert want is not None and out.stdout.split()[0] == want.split()[0]


def test_the_sdist_and_wheel_carry_the_metadata(tmp_path: Path) -> None:
    repo = clone(tmp_path / "quotaplane")
    out = tmp_path / "dist"
    # build_meta rewrites sys.argv as it runs: the directory is read once, first.
    script = "import sys; d = sys.argv[1]; from setuptools import build_meta as b; b.build_sdist(d); b.build_wheel(d)"
    subprocess.run([sys.executable, "-c", script, str(out)], cwd=repo / "sdk" / "python", capture_output=True, check=True)
    sdist, wheel = out / "quotaplane-0.1.0.tar.gz", out / "quotaplane-0.1.0-py3-none-any.whl"
    assert sorted(p.name for p in out.iterdir()) == [wheel.name, sdist.name]
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())
        meta = z.read("quotaplane-0.1.0.dist-info/METADATA").decode()
    assert {"quotaplane/py.typed", "quotaplane/__init__.py", "quotaplane/testing.py"} <= files
    assert not any(f.startswith("tests/") for f in files)
    assert "Requires-Python: >=3.10" in meta and "Requires-Dist: httpx>=0.23" in meta
    assert "# quotaplane (Python)" in meta, "the README is the long description"
    with tarfile.open(sdist) as t:
        members = set(t.getnames())
    assert {"quotaplane-0.1.0/pyproject.toml", "quotaplane-0.1.0/README.md", "quotaplane-0.1.0/quotaplane/py.typed"} <= members
