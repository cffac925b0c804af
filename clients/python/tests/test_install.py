"""The install commands of the README, run as a user would on Debian (PEP 668: no pip into the
system's Python) with no package index: a venv that sees the system's packages and pip without
build isolation, and a wheel built the same way."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# the installed package, never this checkout's src (run-tests puts it on PYTHONPATH)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
    "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def run(*command: object, cwd: Path) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=ENV, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done.stdout


def source(tmp: Path) -> Path:
    """The package as a user has it (a copy: pip builds in the source tree)."""
    copy = tmp / "python"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns(
        "tests", "bench", "build", "*.egg-info", "__pycache__"))
    return copy


def check_installed(venv: Path, cwd: Path) -> None:
    out = run(venv / "bin" / "python", "-c",
              "import importlib.metadata as m, pg_idempotency, pg_idempotency.http as h;"
              " print(pg_idempotency.__file__); print(m.version('pg-idempotency'));"
              " print(h.fingerprint('POST', '/x', None, b'').hex())", cwd=cwd).split()
    assert out[0].startswith(str(venv)), out
    assert out[1] == "1.6.0"
    assert len(out[2]) == 64
    # the system's psycopg is in the pinned range (pip check also names Debian's own
    # unrelated mismatches: only this package's lines count)
    done = subprocess.run([str(venv / "bin" / "pip"), "check"], cwd=cwd, env=ENV,
                          capture_output=True, text=True)
    assert not [line for line in done.stdout.splitlines()
                if line.lower().startswith("pg-idempotency")], done.stdout


def test_venv_with_system_packages_and_no_build_isolation(tmp_path: Path) -> None:
    src = source(tmp_path)
    venv = tmp_path / "venv"
    run("/usr/bin/python3", "-m", "venv", "--system-site-packages", venv, cwd=tmp_path)
    run(venv / "bin" / "pip", "install", "--no-index", "--no-build-isolation", src, cwd=tmp_path)
    check_installed(venv, tmp_path)


def test_a_wheel_built_without_an_index(tmp_path: Path) -> None:
    src = source(tmp_path)
    builder = tmp_path / "builder"
    run("/usr/bin/python3", "-m", "venv", "--system-site-packages", builder, cwd=tmp_path)
    run(builder / "bin" / "pip", "wheel", "--no-index", "--no-build-isolation", "--no-deps",
        "-w", tmp_path / "dist", src, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("pg_idempotency-1.6.0-py3-none-any.whl")
    target = tmp_path / "app"
    run("/usr/bin/python3", "-m", "venv", "--system-site-packages", target, cwd=tmp_path)
    run(target / "bin" / "pip", "install", "--no-index", wheel, cwd=tmp_path)
    check_installed(target, tmp_path)
    assert (Path(run(target / "bin" / "python", "-c",
                     "import pg_idempotency; print(pg_idempotency.__file__)",
                     cwd=tmp_path).strip()).parent / "py.typed").is_file()
