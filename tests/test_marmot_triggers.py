"""Gift-wrapped triggers through a real relay to the APNs and FCM fakes.

The relay is rust-nostr's LocalRelay on loopback, the gift wraps are made by nostr-sdk (or, for forms
nostr-sdk will not make, layer by layer by app.marmot.giftwrap), the tokens inside by our token layer;
the server runs as `xmtp-push marmot` assembles it, sending through the delivery core's providers.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from app.marmot import giftwrap, secp
from app.marmot.keys import ServerKey
from app.marmot.tokens import Platform, encrypt_token
from app.marmot.unwrap import Refused, unwrap_trigger
from fakes.fake_apns import FakeApns
from fakes.fake_apns import Reply as ApnsReply
from fakes.fake_fcm import FakeFcm
from tests.support.marmot import (  # noqa: F401  (fixtures)
    APNS_TOKEN,
    BUNDLE_ID,
    FCM_TOKEN,
    apns_chunk,
    b64,
    event_dict,
    fakes,
    fcm_chunk,
    gift_wrap,
    key,
    marmot_settings,
    padding,
    running_relay,
    send,
    serving,
    settle,
    tokens,
    triggers,
)
from tests.support.pipeline import redis_url  # noqa: F401  (fixture)

# --------------------------------------------------------------------------- delivery


async def test_a_trigger_reaches_apns_and_fcm_exactly(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    accepted, apns_delivered, fcm_delivered = (
        triggers("accepted"),
        tokens("apns", "delivered"),
        tokens("fcm", "delivered"),
    )
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url)):
        await send(relay, key, apns_chunk(key), fcm_chunk(key))
        (apns_request,) = await apns.wait_for(1)
        (fcm_request,) = await fcm.wait_for(1)
        await settle("accepted", accepted)
    assert apns_request.token == APNS_TOKEN
    assert apns_request.json() == {"aps": {"content-available": 1}}
    assert apns_request.body == b'{"aps":{"content-available":1}}'
    assert apns_request.header("apns-push-type") == "background"
    assert apns_request.header("apns-priority") == "5"
    assert apns_request.header("apns-topic") == BUNDLE_ID
    message = fcm_request.json()["message"]
    assert message["token"] == FCM_TOKEN
    assert message["data"] == {"content_available": "true"}
    assert message["android"]["priority"] == "HIGH"
    assert "notification" not in message
    assert (apns.count, fcm.count) == (1, 1)
    assert tokens("apns", "delivered") == apns_delivered + 1
    assert tokens("fcm", "delivered") == fcm_delivered + 1


async def test_padding_is_discarded_and_a_corrupt_chunk_skipped(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    corrupt = bytearray(apns_chunk(key, "c0" * 32))
    corrupt[-1] ^= 1  # the AEAD tag no longer matches
    invalid, accepted = tokens("unknown", "invalid"), triggers("accepted")
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url)):
        chunks = [padding(), apns_chunk(key), bytes(corrupt), padding(), fcm_chunk(key), padding()]
        await send(relay, key, *chunks)
        await settle("accepted", accepted)
    assert [r.token for r in apns.requests] == [APNS_TOKEN]
    assert [r.token for r in fcm.requests] == [FCM_TOKEN]
    assert tokens("unknown", "invalid") == invalid + 4


async def test_a_chunk_repeated_inside_a_trigger_is_sent_once(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, _ = fakes
    accepted = triggers("accepted")
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url)):
        chunk = apns_chunk(key)
        await send(relay, key, chunk, chunk, chunk)
        await settle("accepted", accepted)
    assert apns.count == 1


async def test_dead_and_failing_tokens_are_counted(key: ServerKey, fakes: tuple[FakeApns, FakeFcm]) -> None:
    apns, _ = fakes
    gone, failing = "d0" * 32, "e0" * 32
    apns.script(gone, ApnsReply(410, "Unregistered"))
    apns.script(failing, ApnsReply(500, "InternalServerError"))
    dead, failed, accepted = tokens("apns", "dead"), tokens("apns", "failed"), triggers("accepted")
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url)):
        await send(relay, key, apns_chunk(key, gone), apns_chunk(key, failing))
        await settle("accepted", accepted)
    assert apns.count == 2  # one attempt each: Marmot keeps no state to retry from
    assert tokens("apns", "dead") == dead + 1
    assert tokens("apns", "failed") == failed + 1


async def test_a_platform_without_credentials_counts_its_tokens_failed(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    failed, accepted = tokens("fcm", "failed"), triggers("accepted")
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, fcm_service_account=None)
        async with serving(settings) as server:
            assert await server.can_push()  # APNs alone is enough
            await send(relay, key, apns_chunk(key), fcm_chunk(key))
            await settle("accepted", accepted)
    assert (apns.count, fcm.count) == (1, 0)
    assert tokens("fcm", "failed") == failed + 1


# --------------------------------------------------------------------------- duplicates


async def test_a_duplicate_and_a_rewrapped_duplicate_are_sent_once(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, _ = fakes
    duplicate, accepted = triggers("duplicate"), triggers("accepted")
    async with running_relay() as first, running_relay() as second:
        server = serving(marmot_settings(fakes, key, first.url, second.url))
        async with server:
            content = apns_chunk(key)
            wrap = gift_wrap(key.public_hex, b64(content))
            await first.publish(wrap)
            await second.publish(wrap)  # the same event from a second relay
            await first.publish(gift_wrap(key.public_hex, b64(content)))  # re-wrapped by a replayer
            await settle("duplicate", duplicate, 2)
    assert apns.count == 1
    assert triggers("accepted") == accepted + 1


async def test_two_instances_sharing_redis_push_once(
    key: ServerKey,
    fakes: tuple[FakeApns, FakeFcm],
    redis_url: str,
) -> None:
    apns, _ = fakes
    duplicate, accepted = triggers("duplicate"), triggers("accepted")
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, redis_url=redis_url)
        async with serving(settings), serving(settings):
            await send(relay, key, apns_chunk(key))
            await settle("duplicate", duplicate)
    assert apns.count == 1
    assert triggers("accepted") == accepted + 1


# --------------------------------------------------------------------------- refused forms


NOSTR_SDK_FORMS = ("wrong kind", "wrong tag", "extra tag", "no tag")


def nostr_sdk_form(form: str, key: ServerKey) -> dict[str, Any]:
    content = b64(encrypt_token(key.public_x, Platform.APNS, APNS_TOKEN))
    if form == "wrong kind":
        return event_dict(gift_wrap(key.public_hex, content, kind=445))
    if form == "wrong tag":
        return event_dict(gift_wrap(key.public_hex, content, tags=[["v", "marmot-push-v2"]]))
    if form == "extra tag":
        return event_dict(gift_wrap(key.public_hex, content, tags=[["v", "marmot-push-v1"], ["e", "00"]]))
    if form == "no tag":
        return event_dict(gift_wrap(key.public_hex, content, tags=[]))
    raise AssertionError(form)


def non_canonical_base64(data: bytes) -> str:
    """`data` in base64 whose last group sets bits the padding leaves unused: it decodes to the same
    bytes and does not re-encode to itself. (1084 bytes end in one byte: "XY==", Y's low 4 bits unused.)"""
    assert len(data) % 3 == 1
    text = base64.b64encode(data).decode()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    spoiled = text[:-3] + alphabet[alphabet.index(text[-3]) | 1] + "=="
    assert base64.b64decode(spoiled) == data and spoiled != text
    return spoiled


def layered_form(form: str, key: ServerKey) -> dict[str, Any]:
    """Forms nostr-sdk does not make, built layer by layer with one layer spoiled."""
    sender, chunk = secp.fresh_secret(), encrypt_token(key.public_x, Platform.APNS, APNS_TOKEN)
    rumor = giftwrap.trigger_rumor(sender, chunk)
    seal_tags: list[list[str]] = []
    if form == "rumor and seal pubkeys differ":
        rumor = giftwrap.trigger_rumor(secp.fresh_secret(), chunk)
    elif form == "content too long":
        rumor = giftwrap.trigger_rumor(sender, b"", encoded="A" * 46_256)
    elif form == "non-canonical base64":
        rumor = giftwrap.trigger_rumor(sender, b"", encoded=non_canonical_base64(chunk))
    elif form == "not whole chunks":
        rumor = giftwrap.trigger_rumor(sender, chunk + b"\x00")
    elif form == "more than 32 chunks":
        rumor = giftwrap.trigger_rumor(sender, chunk * 33)
    elif form == "seal with tags":
        seal_tags = [["p", key.public_hex]]
    sealed = giftwrap.seal(rumor, sender, key.public_x, tags=seal_tags)
    if form == "bad seal signature":
        sealed = {**sealed, "sig": sealed["sig"][:-2] + ("00" if sealed["sig"][-2:] != "00" else "01")}
    return giftwrap.gift_wrap(sealed, key.public_x)


REFUSED_FORMS = [
    "wrong kind",
    "wrong tag",
    "extra tag",
    "no tag",
    "rumor and seal pubkeys differ",
    "bad seal signature",
    "seal with tags",
    "non-canonical base64",
    "not whole chunks",
]
# Gift wraps this large exceed the relay's 64 KiB event limit (as on many relays): the relay refuses
# them itself, so they are handed to the handler directly.
OVERSIZED_FORMS = ["content too long", "more than 32 chunks"]


REASONS = {
    "wrong kind": "rumor_kind",
    "wrong tag": "rumor_tags",
    "extra tag": "rumor_tags",
    "no tag": "rumor_tags",
    "rumor and seal pubkeys differ": "rumor_pubkey",
    "bad seal signature": "seal_signature",
    "seal with tags": "seal_tags",
    "non-canonical base64": "content_base64",
    "not whole chunks": "content_length",
    "content too long": "content_too_long",
    # 33 chunks in base64 are over 46,252 characters: refused on the length before decoding.
    "more than 32 chunks": "content_too_long",
}


@pytest.mark.parametrize("form", REFUSED_FORMS + OVERSIZED_FORMS)
def test_each_form_is_refused_for_its_own_reason(form: str, key: ServerKey) -> None:
    build = nostr_sdk_form if form in NOSTR_SDK_FORMS else layered_form
    with pytest.raises(Refused) as refused:
        unwrap_trigger(build(form, key), key)
    assert refused.value.reason == REASONS[form]


async def test_refused_forms_through_the_relay_push_nothing(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, _ = fakes
    invalid, accepted = triggers("invalid"), triggers("accepted")
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url)):
        for form in REFUSED_FORMS:
            build = nostr_sdk_form if form in NOSTR_SDK_FORMS else layered_form
            await relay.publish_json(build(form, key))
        await settle("invalid", invalid, len(REFUSED_FORMS))
        # A valid trigger after them all still goes: nothing was spent on the refused ones.
        await send(relay, key, apns_chunk(key))
        await settle("accepted", accepted)
    assert triggers("invalid") == invalid + len(REFUSED_FORMS)
    assert [r.token for r in apns.requests] == [APNS_TOKEN]


async def test_forms_a_relay_refuses_itself_are_refused_too(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    """A bad wrap signature, and gift wraps over the relay's size limit, handed to the handler directly."""
    async with running_relay() as relay, serving(marmot_settings(fakes, key, relay.url)) as server:
        for form in OVERSIZED_FORMS:
            assert (await server.handler.handle(layered_form(form, key))).value == "invalid", form
        wrap = event_dict(gift_wrap(key.public_hex, b64(apns_chunk(key))))
        spoiled = {**wrap, "sig": ("0" if wrap["sig"][0] != "0" else "1") + wrap["sig"][1:]}
        assert (await server.handler.handle(spoiled)).value == "invalid"
        assert (await server.handler.handle({**wrap, "content": wrap["content"][:-4]})).value == "invalid"
        assert (await server.handler.handle({"kind": 1059})).value == "invalid"
    assert fakes[0].count == 0


# --------------------------------------------------------------------------- rate tiers


async def test_the_global_budget_is_charged_per_gift_wrap_before_unwrapping(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, _ = fakes
    limited, invalid = triggers("rate_limited"), triggers("invalid")
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, marmot_global_per_minute=2)
        async with serving(settings):
            await relay.publish_json(layered_form("bad seal signature", key))  # charged: refused after
            await settle("invalid", invalid)
            await send(relay, key, apns_chunk(key, "01" * 32))
            await send(relay, key, apns_chunk(key, "02" * 32))
            await settle("rate_limited", limited)
    assert [r.token for r in apns.requests] == ["01" * 32]


async def test_the_chunk_limit_is_charged_before_decryption(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, _ = fakes
    limited, accepted = tokens("unknown", "rate_limited"), triggers("accepted")
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, marmot_chunk_per_minute=1)
        async with serving(settings):
            chunk = apns_chunk(key)
            await send(relay, key, chunk)
            await send(relay, key, chunk, padding())  # other content, the same chunk
            await settle("accepted", accepted, 2)
    assert apns.count == 1
    assert tokens("unknown", "rate_limited") == limited + 1


async def test_the_device_limit_is_charged_after_decryption(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    limited, accepted = tokens("apns", "rate_limited"), triggers("accepted")
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, marmot_device_per_minute=1)
        async with serving(settings):
            await send(relay, key, apns_chunk(key), fcm_chunk(key))
            await send(relay, key, apns_chunk(key), fcm_chunk(key, "another-device"))  # new encryptions
            await settle("accepted", accepted, 2)
    assert apns.count == 1
    assert sorted(r.token for r in fcm.requests) == sorted([FCM_TOKEN, "another-device"])
    assert tokens("apns", "rate_limited") == limited + 1


@pytest.mark.slow
async def test_at_most_max_concurrent_triggers_are_in_flight(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, _ = fakes
    accepted = triggers("accepted")
    apns.script("11" * 32, ApnsReply(200, held=True))
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, marmot_max_concurrent=1)
        async with serving(settings):
            await send(relay, key, apns_chunk(key, "11" * 32))
            await apns.wait_for(1)
            await send(relay, key, apns_chunk(key, "22" * 32))
            await asyncio.sleep(0.5)
            assert apns.count == 1  # the second waits for the first's slot
            apns.release()
            await settle("accepted", accepted, 2)
    assert [r.token for r in apns.requests] == ["11" * 32, "22" * 32]


@pytest.mark.slow
async def test_pushes_in_flight_are_bounded_per_channel(
    key: ServerKey, fakes: tuple[FakeApns, FakeFcm]
) -> None:
    apns, fcm = fakes
    accepted = triggers("accepted")
    apns.script("33" * 32, ApnsReply(200, held=True))
    async with running_relay() as relay:
        settings = marmot_settings(fakes, key, relay.url, marmot_pushes_in_flight=1)
        async with serving(settings):
            await send(relay, key, apns_chunk(key, "33" * 32), apns_chunk(key, "44" * 32), fcm_chunk(key))
            await apns.wait_for(1)
            await fcm.wait_for(1)  # another channel's slot
            await asyncio.sleep(0.5)
            assert apns.count == 1  # the second APNs push waits for the first's slot
            apns.release()
            await settle("accepted", accepted)
    assert sorted(r.token for r in apns.requests) == ["33" * 32, "44" * 32]
