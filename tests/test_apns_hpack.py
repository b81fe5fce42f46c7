"""RequestEncoder, the HPACK encoder of our APNs connections, against hpack's own decoder.

Its remembered encodings are indexes into the dynamic table; these tests change the table under
it (a new provider token, a size update from the server, evictions) and check that whatever it
sends still decodes to exactly the headers given, and that per-request values never enter the table.
"""

from __future__ import annotations

import secrets
import uuid

from aioapns.common import NotificationRequest, PushType
from hpack import Decoder, Encoder

from app.delivery.providers.apns_connection import RequestEncoder, request_headers

HOST, TOPIC = b"api.push.apple.com", b"org.example.app"


def a_request() -> NotificationRequest:
    return NotificationRequest(
        device_token=secrets.token_hex(32),
        message={"aps": {"content-available": 1}},
        notification_id=str(uuid.uuid4()),
        priority=5,
        push_type=PushType.BACKGROUND,
        collapse_key=secrets.token_urlsafe(30),
    )


def plain(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(bytes(name), bytes(value)) for name, value in headers]


def test_every_block_decodes_to_the_headers_given_as_the_table_changes() -> None:
    encoder, decoder = RequestEncoder(), Decoder()
    token = b"bearer " + secrets.token_urlsafe(180).encode()
    for number in range(300):
        if number in (50, 51, 120):  # the provider token renewed: a new entry shifts every index
            token = b"bearer " + secrets.token_urlsafe(180).encode()
        if number == 200:  # the server shrinks the table: a size update, evictions
            encoder.header_table_size = 256
            decoder.header_table_size = 256
        headers = request_headers(a_request(), HOST, TOPIC, token)
        decoded = decoder.decode(encoder.encode(headers), raw=True)
        assert plain(decoded) == plain(headers), number


def test_repeated_headers_become_indexes_and_request_values_stay_out_of_the_table() -> None:
    encoder, decoder = RequestEncoder(), Decoder()
    token = b"bearer " + secrets.token_urlsafe(180).encode()
    sizes = []
    for _ in range(20):
        request = a_request()
        block = encoder.encode(request_headers(request, HOST, TOPIC, token))
        decoder.decode(block, raw=True)
        sizes.append(len(block))
        stored = {value for _, value in decoder.header_table.dynamic_entries}
        assert request.device_token.encode() not in {v.rsplit(b"/", 1)[-1] for v in stored}
        assert request.notification_id.encode() not in stored
        assert request.collapse_key is not None and request.collapse_key.encode() not in stored
    assert token in {value for _, value in decoder.header_table.dynamic_entries}
    # After the first request: the six repeated headers cost a byte each, the three per-request
    # values (74 + 36 + 40 bytes of text) travel as literals with their name indexed or spelled out.
    assert sizes[0] > 250
    assert max(sizes[1:]) < 190


def test_same_bytes_as_hpacks_encoder_once_warm() -> None:
    """With the table in the same state, the remembered bytes are what hpack itself would send."""
    ours, theirs = RequestEncoder(), Encoder()
    token = b"bearer " + secrets.token_urlsafe(180).encode()
    for _ in range(5):
        headers = request_headers(a_request(), HOST, TOPIC, token)
        fixed = [h for h in headers if getattr(h, "indexable", True)]
        assert ours.encode(fixed) == theirs.encode(fixed)
