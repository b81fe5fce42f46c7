"""The README's "Your first hint" runs as written: its shell blocks, top to bottom in one bash, start a
receiver and `xmtp-push dev`, register, subscribe, ingest, and the receiver prints the hint it verified.

The blocks are taken from README.md itself, so the commands a user copies cannot rot. Only the ports
change (to free ones, so the test runs beside other servers); everything else runs as printed, in an
empty directory whose `.venv` is this interpreter's environment and with no XMTP_PUSH_* setting of ours.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.ops import free_port
from tests.support.readme import section

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HEADING = "## Your first hint"
TOPIC = "AAABAgMEBQYHCAkKCwwNDg8="
RUN_SECONDS = 120.0  # the README promises a hint well within two minutes of a fresh clone


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def with_port(script: str, port: int, free: int) -> str:
    """The script with every use of `port` replaced by `free`; it must use it at least once."""
    replaced, count = re.subn(rf"\b{port}\b", str(free), script)
    assert count, f"the first-hint blocks no longer use port {port}"
    return replaced


def test_the_first_hint_comes_right_after_the_first_screen() -> None:
    text = README.read_text(encoding="utf-8")
    first_screen = ("make install run", "make install check")
    assert all(text.index(command) < text.index(HEADING) for command in first_screen)
    assert text.index("\n## ", text.index("make install check")) + 1 == text.index(
        HEADING
    )  # the next section


def test_the_readme_first_hint_blocks_deliver_a_verified_hint(tmp_path: Path) -> None:
    blocks = shell_blocks(section(README.read_text(encoding="utf-8"), HEADING))
    assert len(blocks) >= 4, "the first-hint section lost its shell blocks"
    http_port, receiver_port = free_port(), free_port()
    script = with_port(with_port("\n".join(blocks), 8080, http_port), 9000, receiver_port)
    (tmp_path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    env = {name: value for name, value in os.environ.items() if not name.startswith("XMTP_PUSH_")}
    # The README's servers on free ports: HTTP through the substitution above, gRPC (which the blocks
    # never name) through its setting. PYTHONPATH: the code of this tree, whatever the venv points at.
    env |= {"XMTP_PUSH_HTTP_PORT": str(http_port), "XMTP_PUSH_GRPC_PORT": "0", "PYTHONPATH": str(ROOT)}
    output, code, seconds = run_in_one_shell(script, tmp_path, env)
    print(f"the first hint took {seconds:.1f} s")
    assert code == 0, output
    assert f"verified hint: topic={TOPIC} sequence_id=42\n" in output, output
    assert '"channel":"CHANNEL_HTTP"' in output, output  # Register's answer
    assert '"topicCount":"1"' in output, output  # UpdateSubscriptions' answer
    assert '{"accepted":1,"not_pushable":0,"not_pushable_reasons":{}}' in output, output
    assert "Traceback" not in output, output


def run_in_one_shell(script: str, cwd: Path, env: dict[str, str]) -> tuple[str, int, float]:
    """Run `script` in one `bash -e` (stopping at the first failing command); whatever it left
    running is killed with its process group. Returns its output, exit code and duration."""
    log = cwd / "output.log"
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = process.wait(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        code = -1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything the script left running
        process.wait()
    output = log.read_text()
    assert code != -1, f"the first-hint blocks did not finish in {RUN_SECONDS} s\n{output}"
    return output, code, time.monotonic() - started
