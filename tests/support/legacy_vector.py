"""The legacy API's test vector (docs/legacy.md#test-vector): its group, time, root key and message,
and a client's key for a period, derived as a client derives it."""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

GROUP_ID = bytes(range(16))
TOPIC = "/xmtp/mls/1/g-000102030405060708090a0b0c0d0e0f/proto"
TIMESTAMP_NS = 1_741_283_556_527_942_000
ROOT_KEY = b"\x2a" * 32
DATA = b"legacy push test vector"
MESSAGE_B64 = "ClsIBxDw0s6AtIWSlRgaEAABAgMEBQYHCAkKCwwNDg8iF2xlZ2FjeSBwdXNoIHRlc3QgdmVjdG9yKiDTzaB7M+ug8QJgJdCBGTVL4OfjUgigUFy9j5p4/191tjAB"


def key(for_period: int) -> bytes:
    """A client's HMAC key for a period: HKDF-SHA256, salt `libXMTP HKDF salt!`, input root key ‖ group
    id, info group id ‖ period as 8 bytes little-endian, 42 bytes."""
    info = GROUP_ID + for_period.to_bytes(8, "little")
    return HKDF(hashes.SHA256(), 42, b"libXMTP HKDF salt!", info).derive(ROOT_KEY + GROUP_ID)
