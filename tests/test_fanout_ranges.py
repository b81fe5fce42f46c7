"""How a large topic's fan-out is cut into recipient-id ranges, how a range travels, and the key that
lets an envelope be fanned out once."""

from __future__ import annotations

import base64
import json
import secrets

import pytest

from app.envelopes.types import Envelope, EnvelopeKind
from app.fanout.fanout_job import FanoutJob
from app.fanout.service import split_after


def _covering(ranges: list[tuple[bytes, bytes]], rid: bytes) -> list[int]:
    return [n for n, (after, until) in enumerate(ranges) if after < rid and (not until or rid <= until)]


@pytest.mark.parametrize("parts", [2, 5, 16, 256])
@pytest.mark.parametrize("first_byte", [0x00, 0x02, 0x7F, 0xFD])
def test_ranges_cover_every_later_id_exactly_once(parts: int, first_byte: int) -> None:
    last = bytes([first_byte]) + secrets.token_bytes(31)
    ranges = split_after(last, b"", parts)
    assert 2 <= len(ranges) <= parts
    assert ranges[0][0] == last and ranges[-1][1] == b""
    later = [rid for rid in (secrets.token_bytes(32) for _ in range(3000)) if rid > last]
    # The edges: ids that are exactly a cut, or just above one.
    later += [until for _, until in ranges[:-1]] + [until + b"\x00" for _, until in ranges[:-1]]
    later += [bytes([first_byte]) + b"\xff" * 31, b"\xff" * 32]
    for rid in later:
        if rid > last:
            assert len(_covering(ranges, rid)) == 1, rid.hex()
    for rid in (last, bytes([first_byte]) + b"\x00" * 31):
        if rid <= last:
            assert _covering(ranges, rid) == []


def test_random_ids_spread_evenly_over_the_ranges() -> None:
    last = b"\x03" + b"\x00" * 31
    ranges = split_after(last, b"", 8)
    counts = [0] * len(ranges)
    for _ in range(40_000):
        rid = secrets.token_bytes(32)
        if rid > last:
            counts[_covering(ranges, rid)[0]] += 1
    assert len(ranges) == 8
    assert max(counts) < 1.2 * min(counts), counts


def test_no_split_within_a_range_nor_at_the_top_nor_when_asked_for_one() -> None:
    last = b"\x10" * 32
    assert split_after(last, b"\x40", 8) == [(last, b"\x40")]
    assert split_after(last, b"", 1) == [(last, b"")]
    top = b"\xff" * 32
    assert split_after(top, b"", 8) == [(top, b"")]
    near_top = b"\xfe" + b"\x00" * 31
    assert split_after(near_top, b"", 8) == [(near_top, b"\xff"), (b"\xff", b"")]


def test_a_range_job_round_trips_and_is_not_a_first_page() -> None:
    envelope = Envelope(
        topic=b"\x01\x02", sequence_id=3, server_ns=4, kind=EnvelopeKind.WELCOME, received_ns=5
    )
    job = FanoutJob(envelope, b"\x20" * 32, b"\x40")
    decoded = FanoutJob.decode(job.encode())
    assert decoded == job and not decoded.first_page
    assert not FanoutJob(envelope, b"", b"\x40").first_page
    assert FanoutJob(envelope).first_page


def test_an_entry_queued_without_a_range_end_covers_the_rest() -> None:
    envelope = Envelope(topic=b"\x01", sequence_id=3, server_ns=4, kind=EnvelopeKind.WELCOME, received_ns=5)
    fields = json.loads(FanoutJob(envelope, b"\x09" * 32).encode())
    del fields["u"]
    decoded = FanoutJob.decode(json.dumps(fields).encode())
    assert decoded.after == b"\x09" * 32 and decoded.until == b""


def _envelope(topic: bytes = b"\x01\x02", sequence_id: int = 3, received_ns: int = 5) -> Envelope:
    return Envelope(
        topic=topic, sequence_id=sequence_id, server_ns=4, kind=EnvelopeKind.WELCOME, received_ns=received_ns
    )


def test_the_dedup_key_is_one_per_envelope() -> None:
    key = FanoutJob(_envelope()).dedup_key
    # The same envelope taken in again (later, by another route), or a later page of it: the same key.
    assert FanoutJob(_envelope(received_ns=99)).dedup_key == key
    assert FanoutJob(_envelope(), b"\x20" * 32, b"\x40").dedup_key == key
    assert FanoutJob(_envelope(sequence_id=4)).dedup_key != key
    assert FanoutJob(_envelope(topic=b"\x01\x03")).dedup_key != key
    # Topic and sequence id are not run together ambiguously.
    assert (
        FanoutJob(_envelope(topic=b"\x01|2", sequence_id=3)).dedup_key
        != FanoutJob(_envelope(topic=b"\x01", sequence_id=23)).dedup_key
    )


def test_the_dedup_key_does_not_reveal_the_topic() -> None:
    topic = b"\x01" + bytes.fromhex("fedcba9876543210" * 2)
    key = FanoutJob(_envelope(topic=topic, sequence_id=42)).dedup_key
    for secret in (topic.hex(), topic[1:].hex(), base64.b64encode(topic).decode()):
        for start in range(0, len(secret) - 8 + 1, 2):
            assert secret[start : start + 8] not in key
    assert len(key) >= 32
