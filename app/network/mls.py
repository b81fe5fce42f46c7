"""Telling MLS commits and proposals apart from application messages by their framing.

Only the clear-text prefix of an MLSMessage is read: version, wire format, then
for PublicMessage and PrivateMessage the group id, epoch and (PublicMessage) the
sender and authenticated data, up to the content type. Anything that does not
parse counts as an application message (fail open: a hint too many beats one
too few).
"""

from __future__ import annotations

MLS_VERSION_10 = 1
WIRE_PUBLIC_MESSAGE = 1
WIRE_PRIVATE_MESSAGE = 2
CONTENT_PROPOSAL = 2
CONTENT_COMMIT = 3
# Sender types with a 4-byte leaf or sender index after them.
SENDERS_WITH_INDEX = {1, 2}
SENDERS_WITHOUT_INDEX = {3, 4}


class _Truncated(Exception):
    pass


class _Reader:
    __slots__ = ("data", "offset")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def take(self, count: int) -> bytes:
        end = self.offset + count
        if end > len(self.data):
            raise _Truncated
        chunk = self.data[self.offset : end]
        self.offset = end
        return chunk

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def skip_vector(self) -> None:
        """An MLS variable-length vector: 2 top bits give the length of the length."""
        first = self.uint(1)
        prefix = first >> 6
        if prefix == 3:
            raise _Truncated
        size = (1, 2, 4)[prefix]
        length = first & 0x3F
        for _ in range(size - 1):
            length = (length << 8) | self.uint(1)
        self.take(length)


def is_commit_or_proposal(data: bytes) -> bool:
    try:
        return _content_type(_Reader(data)) in (CONTENT_PROPOSAL, CONTENT_COMMIT)
    except _Truncated:
        return False


def _content_type(reader: _Reader) -> int | None:
    if reader.uint(2) != MLS_VERSION_10:
        return None
    wire_format = reader.uint(2)
    if wire_format not in (WIRE_PUBLIC_MESSAGE, WIRE_PRIVATE_MESSAGE):
        return None
    reader.skip_vector()  # group_id
    reader.take(8)  # epoch
    if wire_format == WIRE_PUBLIC_MESSAGE:
        sender_type = reader.uint(1)
        if sender_type in SENDERS_WITH_INDEX:
            reader.take(4)
        elif sender_type not in SENDERS_WITHOUT_INDEX:
            return None
        reader.skip_vector()  # authenticated_data
    return reader.uint(1)
