"""The installed package is complete: a wheel built from the tree, installed into a fresh virtual
environment outside it, migrates a database on its own (its migrations ship inside it).

The fresh environment gets the wheel alone (`--no-deps`); its dependencies are those of the
environment running the tests, reached through a .pth file, so the test needs no package index.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

TREE = Path(__file__).resolve().parents[1]
SHIPPED = ("pyproject.toml", "README.md", "app", "workers", "alembic")
# Packages of the tree for development only: the endpoint fakes, the tests, the benchmarks.
DEVELOPMENT = ("fakes", "tests", "bench")
RUN_TIMEOUT = 120.0


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )
    assert result.returncode == 0, f"{args}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def build_wheel(work: Path, names: tuple[str, ...] = SHIPPED) -> Path:
    """The wheel of a copy of the tree (so no build/ or egg-info lands in the tree itself)."""
    source = work / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in names:
        path = TREE / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    _run([*pip, "--wheel-dir", str(wheels), str(source)], work)
    (wheel,) = wheels.glob("xmtp_push-*.whl")
    return wheel


def fresh_venv(work: Path) -> Path:
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], work)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], work)
    # The dependencies: the test environment's site-packages, after the fresh one's own.
    Path(purelib.stdout.strip(), "test-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def outside_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XMTP_PUSH_") and k != "PYTHONPATH"}
    return {**env, **settings}


def test_migrate_runs_from_a_wheel_installed_outside_the_tree(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    venv = fresh_venv(tmp_path)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index"]
    _run([*pip, str(wheel)], tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    where = _run([python, "-c", "import app; print(app.__file__)"], elsewhere, outside_env())
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's code, not the tree's

    db = tmp_path / "from-wheel.db"
    env = outside_env(XMTP_PUSH_DATABASE_URL=f"sqlite+aiosqlite:///{db}")
    result = _run([str(venv / "bin" / "xmtp-push"), "migrate"], elsewhere, env)
    assert "Traceback" not in result.stderr
    with sqlite3.connect(db) as connection:
        names = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        head = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    assert {"recipients", "subscriptions", "listener_cursors", "alembic_version"} <= names
    assert head == [(ScriptDirectory(str(TREE / "alembic")).get_current_head(),)]  # every revision ran


def test_an_install_without_its_migrations_says_so_in_one_line(tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index"]
    _run([*pip, str(build_wheel(tmp_path))], tmp_path)
    shutil.rmtree(venv / "share" / "xmtp-push" / "alembic")  # a broken or repackaged install

    env = outside_env(XMTP_PUSH_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}")
    result = subprocess.run(
        [str(venv / "bin" / "xmtp-push"), "migrate"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert result.returncode == 9, result
    assert result.stderr == (
        "xmtp-push: the migration scripts are not installed: reinstall the xmtp-push package\n"
    )


def test_the_wheel_holds_the_product_and_no_development_package(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, SHIPPED + DEVELOPMENT)  # built beside them, as from a checkout
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    packages = {top for top in tops if not top.startswith("xmtp_push-")}  # .dist-info, .data
    assert packages == {"app", "workers"}
