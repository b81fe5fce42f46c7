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


def is_commit_or_proposal(data: bytes) -> bool:
    return _content_type(data) in (CONTENT_PROPOSAL, CONTENT_COMMIT)


def _content_type(data: bytes) -> int | None:
    """The content type byte, or None when the framing does not parse that far.

    Reads by index rather than through a reader object: this runs for every group message the
    listener sees."""
    size = len(data)
    # u16 version == 1, u16 wire_format in (PublicMessage, PrivateMessage), big-endian.
    if size < 4 or data[0] != 0 or data[1] != MLS_VERSION_10 or data[2] != 0:
        return None
    wire_format = data[3]
    if wire_format != WIRE_PUBLIC_MESSAGE and wire_format != WIRE_PRIVATE_MESSAGE:
        return None
    offset = _skip_vector(data, 4, size)  # group_id
    if offset < 0:
        return None
    offset += 8  # epoch
    if wire_format == WIRE_PUBLIC_MESSAGE:
        if offset >= size:
            return None
        sender_type = data[offset]
        offset += 1
        if sender_type in SENDERS_WITH_INDEX:
            offset += 4
        elif sender_type not in SENDERS_WITHOUT_INDEX:
            return None
        offset = _skip_vector(data, offset, size)  # authenticated_data
        if offset < 0:
            return None
    if offset >= size:
        return None
    return data[offset]


def _skip_vector(data: bytes, offset: int, size: int) -> int:
    """The offset after an MLS variable-length vector (2 top bits give the length of the length),
    or -1 when it does not fit in the data or its prefix is the invalid 11."""
    if offset >= size:
        return -1
    first = data[offset]
    prefix = first >> 6
    if prefix == 3:
        return -1
    length = first & 0x3F
    if prefix:
        width = 2 if prefix == 1 else 4
        if offset + width > size:
            return -1
        for index in range(offset + 1, offset + width):
            length = (length << 8) | data[index]
        offset += width
    else:
        offset += 1
    offset += length
    return offset if offset <= size else -1
