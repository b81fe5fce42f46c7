"""The "Webhook receivers" section of docs/api.md against the code: headers, secret form, body, and the
table of answers and what follows them, so that the contract a receiver's author reads cannot drift
from what the webhook provider and the retry rule do."""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from app.delivery import host_guard, pinned_http, retry
from app.delivery.providers import webhook
from app.delivery.types import Outcome, OutcomeKind
from app.fanout.delivery_job import DeliveryJob
from app.fanout.hints import Hint, webhook_body, webhook_id
from tests.support.readme import section, table

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"
HINT = Hint(b"\x00" + bytes(range(16)), 42, b"\x01" * 32)
STATUSES = range(100, 600)


@pytest.fixture(scope="module")
def contract() -> str:
    return section(API_PAGE.read_text(encoding="utf-8"), "## Webhook receivers")


def documented_name(outcome: Outcome) -> str:
    """An outcome as the page names it: a webhook's "gone" is a dead target confirmed by retrying."""
    return "gone" if outcome.confirm_by_retry else outcome.kind.value


def statuses_in(cell: str) -> set[int]:
    codes: set[int] = set()
    for low, high in re.findall(r"`(\d{3})`(?: to `(\d{3})`)?", cell):
        codes.update(range(int(low), int(high or low) + 1))
    return codes


def documented_outcomes(contract: str) -> tuple[dict[int, str], str, str]:
    """Status -> outcome from the answers table, the outcome of any other status, and that of a
    request that got no answer."""
    explicit: dict[int, str] = {}
    other = unanswered = ""
    for answer, outcome, _ in table(contract, "answer"):
        if answer.startswith("any other status"):
            other = outcome
        elif answer.startswith("timeout"):
            unanswered = outcome
        else:
            codes = statuses_in(answer)
            assert codes, f"a row of the answers table names no status: {answer}"
            explicit |= dict.fromkeys(codes, outcome)
    assert other and unanswered, "the answers table lost its rows for other statuses and for no answer"
    return explicit, other, unanswered


def test_every_status_has_the_documented_outcome(contract: str) -> None:
    explicit, other, _ = documented_outcomes(contract)
    code = {status: documented_name(webhook.outcome_for_status(status)) for status in STATUSES}
    documented = {status: explicit.get(status, other) for status in STATUSES}
    assert {s: (documented[s], code[s]) for s in STATUSES if documented[s] != code[s]} == {}


def test_no_answer_is_the_documented_outcome(contract: str) -> None:
    _, _, unanswered = documented_outcomes(contract)
    assert documented_name(webhook.UNREACHABLE) == unanswered == "failed"
    for error in (TimeoutError, ConnectionRefusedError, ConnectionResetError):
        assert issubclass(error, webhook.TRANSIENT_ERRORS)


def test_the_documented_bounds_are_the_codes(contract: str) -> None:
    text = " ".join(contract.split())
    assert f"when the first {retry.GONE_CONFIRMATIONS} attempts at a hint" in text
    assert f"doubling with each attempt, up to {retry.MAX_BACKOFF_SECONDS / 60:.0f} minutes" in text
    assert f"at most {pinned_http.MAX_ANSWER_BYTES // 1024} KiB of the answer is read" in text
    assert f"{host_guard.FAILURES_TO_OPEN} timeouts or failed connections" in text
    assert f"park it for {host_guard.OPEN_SECONDS:.0f} s" in text
    assert f"up to {host_guard.MAX_OPEN_SECONDS / 60:.0f} minutes; one probe decides" in text
    assert f"`XMTP_PUSH_WEBHOOK_MAX_PER_HOST` ({webhook.MAX_PER_HOST})" in text


@pytest.mark.parametrize("max_attempts", [15, 2])
def test_gone_is_believed_after_the_documented_attempts(max_attempts: int) -> None:
    job = DeliveryJob(HINT.recipient_id, HINT.topic, HINT.sequence_id, 0)
    gone = webhook.outcome_for_status(410)
    for _ in range(min(max_attempts, retry.GONE_CONFIRMATIONS) - 1):
        step = retry.next_step(job, gone, max_attempts, 1.0)
        assert isinstance(step, retry.Retry)
        job = step.job
    assert retry.next_step(job, gone, max_attempts, 1.0) == Outcome(OutcomeKind.DEAD)
    # One answer in between that is not "gone" and the hint is only ever retried, never found dead.
    assert retry.next_step(job._replace(all_gone=False), gone, max_attempts, 1.0) != Outcome(OutcomeKind.DEAD)


def test_the_documented_headers_are_the_ones_sent(contract: str) -> None:
    documented = {row[0].strip("`") for row in table(contract, "header")}
    sent = webhook.signed_headers(b"k" * 32, webhook_id(HINT), 1_700_000_000, webhook_body(HINT))
    assert documented == set(sent)
    assert re.fullmatch(r"hint_[0-9a-f]{32}", sent["webhook-id"])
    assert sent["webhook-signature"].startswith("v1,")


def test_the_documented_body_is_the_one_sent(contract: str) -> None:
    example = re.search(r"```json\n(.*?)\n```", contract, flags=re.DOTALL)
    assert example is not None
    assert example.group(1).encode() == webhook_body(HINT)
    documented = [row[0].strip("`") for row in table(contract, "field")]
    assert documented == ["topic", "sequence_id", "recipient_id"]


@pytest.mark.parametrize("form", ["whsec", "raw"])
def test_a_receiver_verifies_with_the_documented_secret_forms(form: str) -> None:
    key = bytes(range(32))
    secret = "whsec_" + base64.b64encode(key).decode() if form == "whsec" else key
    body = webhook_body(HINT)
    headers = webhook.signed_headers(key, webhook_id(HINT), int(time.time()), body)
    assert Webhook(secret).verify(body, headers) == {
        "topic": "AAABAgMEBQYHCAkKCwwNDg8=",
        "sequence_id": "42",
        "recipient_id": "01" * 32,
    }
