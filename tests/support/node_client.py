"""The Node client of the legacy API (tests/node_client/): connect-node and code protoc-gen-es generates
from our proto, at the versions of its package-lock.json.

`npm ci` runs once per lock: its node_modules is kept in the user's cache under the lock's hash, so a
second run (and CI's next run on the same machine) installs nothing. Each run generates the code from
app/proto as it is, in a folder of its own that links that node_modules."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.support.ops import ROOT, Result, run_child

CLIENT = ROOT / "tests" / "node_client"
PROTO = ROOT / "app" / "proto" / "notifications" / "v1" / "service.proto"
# What `npm ci` reads: a change to any of them is another install.
LOCKED = ("package.json", "package-lock.json", ".npmrc")
INSTALL_SECONDS = 300.0
RUN_SECONDS = 120.0


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xmtp-push-tests"


def lock_key() -> str:
    digest = hashlib.sha256()
    for name in LOCKED:
        digest.update(name.encode() + b"\0" + (CLIENT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def succeeded(result: Result) -> Result:
    assert result.returncode == 0, str(result)
    return result


async def installed_packages() -> Path:
    """node_modules as the lock has it, installed once per lock. Runs may race (two test sessions on one
    machine): each installs into a folder of its own and renames it into place, the first one wins."""
    target = cache_root() / f"node-client-{lock_key()}"
    if not (target / "node_modules").is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
        try:
            for name in LOCKED:
                shutil.copy(CLIENT / name, staging / name)
            command = ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
            succeeded(await run_child(command, dict(os.environ), INSTALL_SECONDS, cwd=staging))
            os.rename(staging, target)
        except OSError:
            if not (target / "node_modules").is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target / "node_modules"


async def client_report(folder: Path, http_url: str, grpc_url: str) -> dict[str, Any]:
    """Generate the client's code in `folder` and run it against the API at these addresses; what it
    printed (client.js says what it calls and how it reports)."""
    modules = await installed_packages()
    (folder / "node_modules").symlink_to(modules, target_is_directory=True)
    for name in ("client.js", "buf.gen.yaml", "package.json"):
        shutil.copy(CLIENT / name, folder / name)
    proto = folder / "proto" / PROTO.relative_to(ROOT / "app" / "proto")
    proto.parent.mkdir(parents=True)
    shutil.copy(PROTO, proto)
    env = {**os.environ, "PATH": f"{modules / '.bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    succeeded(await run_child(["buf", "generate", "proto"], env, RUN_SECONDS, cwd=folder))
    ran = succeeded(await run_child(["node", "client.js", http_url, grpc_url], env, RUN_SECONDS, cwd=folder))
    report: dict[str, Any] = json.loads(ran.stdout)
    return report
