"""What a new user meets in the first hour: help that names every command and setting, a ready line
that says where to connect, and answers that say what to set or why nothing was pushed."""

from __future__ import annotations

import json
import logging
import re
import signal
from pathlib import Path

import pytest

from tests.support.cli import dev_env, run, started, stop, wait_healthy
from tests.support.ops import free_port
from tests.support.pipeline import INGEST_TOKEN, Stack, envelope, group_topic, running_pipeline
from tests.support.process import clean_env
from tests.support.readme import section, table

# Every test here runs the product end to end: a second or more each.
pytestmark = pytest.mark.slow

COMMANDS = (
    "dev",
    "api",
    "worker",
    "listen",
    "migrate",
    "marmot",
    "gateway",
    "send-test",
    "stats",
    "config",
    "healthcheck",
    "legacy",
)


def help_entries(text: str) -> dict[str, str]:
    """`xmtp-push --help`'s command list: name -> its help line (wrapped lines joined)."""
    listing = text.split("COMMAND\n", 1)[1].split("\noptions:", 1)[0]
    entries: dict[str, str] = {}
    name = ""
    for line in listing.splitlines():
        match = re.match(r"^    (\S+)\s*(.*)$", line)
        if match:
            name = match.group(1)
            entries[name] = match.group(2)
        elif name:
            entries[name] = f"{entries[name]} {line.strip()}".strip()
    return entries


def test_every_command_has_a_help_line(tmp_path: Path) -> None:
    result = run(["--help"], clean_env(), tmp_path)
    assert result.returncode == 0, result.stderr
    entries = help_entries(result.stdout)
    assert set(entries) == set(COMMANDS)
    assert all(len(entries[name].split()) >= 3 for name in COMMANDS), entries


@pytest.mark.parametrize("name", ["send-test", "stats", "listen"])
def test_a_commands_own_help_describes_it(tmp_path: Path, name: str) -> None:
    listed = help_entries(run(["--help"], clean_env(), tmp_path).stdout)[name]
    result = run([name, "--help"], clean_env(), tmp_path)
    assert result.returncode == 0, result.stderr
    assert listed in " ".join(result.stdout.split())


def test_listen_help_names_its_settings_with_their_prefix(tmp_path: Path) -> None:
    text = " ".join(run(["listen", "--help"], clean_env(), tmp_path).stdout.split())
    assert "XMTP_PUSH_XMTPD_ADDRESS" in text
    assert "XMTP_PUSH_REDIS_URL" in text
    assert re.search(r"(?<!XMTP_PUSH_)\bREDIS_URL", text) is None


def test_the_ready_line_gives_each_servers_host_and_port(tmp_path: Path) -> None:
    http_port, grpc_port = free_port(), free_port()
    with started(["dev"], dev_env(tmp_path, http_port, grpc_port), tmp_path) as process:
        wait_healthy(process, http_port)
        code, _, err = stop(process, signal.SIGTERM)
    assert code == 0, err
    assert f"serving http=127.0.0.1:{http_port} grpc=127.0.0.1:{grpc_port}" in err


@pytest.fixture
def memory_stack(sqlite_url: str) -> Stack:
    return Stack("memory", "sqlite", sqlite_url, None)


async def test_disabled_ingest_names_the_setting_that_enables_it(memory_stack: Stack) -> None:
    async with running_pipeline(memory_stack, workers=False, ingest_token=None) as pipe:
        response = await pipe.ingest([envelope(group_topic(), 1)], token=INGEST_TOKEN)
    assert response.status_code == 404
    assert response.json() == {"error": "ingest is disabled: set XMTP_PUSH_INGEST_TOKEN to enable it"}


async def test_an_envelope_nobody_will_receive_is_accepted_and_said_so(
    memory_stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    topic = group_topic()
    batch = [
        envelope(topic, 1, should_push=None),  # the first envelope a new user writes
        envelope(topic, 2, should_push=False),
        envelope(topic, 3, kind="other"),
        envelope(topic, 4),
        envelope(topic, 5, should_push=None, commit=True),  # commits: for include_commits subscribers
    ]
    async with running_pipeline(memory_stack, workers=False) as pipe:
        with caplog.at_level(logging.INFO, logger="app.api"):
            answer = await pipe.ingest_ok(batch)
            quiet = await pipe.ingest_ok([envelope(topic, 6)])
    assert answer == {
        "accepted": 5,
        "not_pushable": 3,
        "not_pushable_reasons": {"group_message_without_should_push": 2, "kind_other": 1},
    }
    assert quiet == {"accepted": 1, "not_pushable": 0, "not_pushable_reasons": {}}
    lines = [r.getMessage() for r in caplog.records if r.name == "app.api.ingest"]
    assert lines == [
        "ingested 5 envelopes, 3 not pushable (group_message_without_should_push 2, kind_other 1)"
    ]


def test_the_api_page_documents_ingest_as_the_openapi_document_does() -> None:
    root = Path(__file__).resolve().parents[1]
    text = section((root / "docs" / "api.md").read_text(encoding="utf-8"), "### Ingest")
    document = json.loads((root / "openapi" / "openapi.json").read_text(encoding="utf-8"))
    post = document["paths"]["/v1/envelopes"]["post"]
    batch = post["requestBody"]["content"]["application/json"]["schema"]["properties"]["envelopes"]
    rows = {row[0].strip("`"): row[1] for row in table(text, "field")}
    assert set(rows) == set(batch["items"]["properties"])
    assert {name for name, required in rows.items() if required == "yes"} == set(batch["items"]["required"])
    assert f"with {batch['minItems']} to {batch['maxItems']} of these" in " ".join(text.split())
    answer = re.search(r"```json\n(.*?)\n```", text, flags=re.DOTALL)
    assert answer is not None
    schema = post["responses"]["202"]["content"]["application/json"]["schema"]
    assert set(json.loads(answer.group(1))) == set(schema["properties"]) == set(schema["required"])
