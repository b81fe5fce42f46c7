"""One live gift wrap, from admission to its pushes, in the order of docs/marmot.md#the-trigger, cheap checks first.

1. A wrap already unwrapped (the same event from another relay) is a duplicate: no work at all.
2. The global budget is charged, once per gift wrap, before unwrapping.
3. Unwrap (app.marmot.unwrap): signatures, both NIP-44 layers, the rumor's kind, tags and content form.
4. A content already acted on (SHA-256 of the decoded content, never the outer event id) is a
   duplicate, in memory or in Redis.
5. Each distinct chunk: its own limit (SHA-256 of the chunk) before its ECDH, then decryption (a chunk
   that fails is padding or corrupt: skipped), then the device's limit (SHA-256 of platform byte and
   token). A chunk repeated inside the trigger is sent once.
6. One push per token admitted, all at once.

Steps 1 to 3 and step 5 are CPU work: each is one piece run in turn with the other handlers' pieces
(app.marmot.cpu_turns), so that the relay readers sharing the event loop keep reading meanwhile.

Nothing about a trigger is stored or logged; the outcomes are counted in metrics.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from app.core import metrics
from app.core.config import Settings
from app.delivery.registry import ProviderRegistry
from app.marmot.admission import Dedup, RateLimiter, RecentDigests, Tier
from app.marmot.cpu_turns import CpuTurns
from app.marmot.dispatch import SILENT, ApnsPayload, Dispatcher, channel_of
from app.marmot.keys import ServerKey
from app.marmot.push_health import PushHealth
from app.marmot.relay_session import event_of_frame
from app.marmot.shared_limits import SharedLimits
from app.marmot.tokens import DeviceToken, TokenError, decrypt_token, token_bytes
from app.marmot.unwrap import Refused, split_chunks, unwrap_trigger

log = logging.getLogger("app.marmot")


class TriggerResult(enum.Enum):
    ACCEPTED = "accepted"  # unwrapped and admitted
    DUPLICATE = "duplicate"
    BACKLOG = "backlog"  # stored before the subscription's EOSE: not pushed
    INVALID = "invalid"
    RATE_LIMITED = "rate_limited"


@dataclass(frozen=True, slots=True)
class Limits:
    global_: Tier
    chunk: Tier
    device: Tier

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            Tier(settings.marmot_global_per_minute, settings.marmot_global_per_hour),
            Tier(settings.marmot_chunk_per_minute, settings.marmot_chunk_per_hour),
            Tier(settings.marmot_device_per_minute, settings.marmot_device_per_hour),
        )


def count_trigger(result: TriggerResult) -> None:
    _trigger_counter(result.value).inc()


def _count_token(platform: str, outcome: str) -> None:
    """`platform`: the token's channel, or "unknown" for a chunk that gave no token."""
    _token_counter(platform, outcome).inc()


# Each counter child looked up once: a label lookup per token adds up at ten tokens a trigger.
@functools.cache
def _trigger_counter(result: str) -> Any:
    return metrics.marmot_triggers_total.labels(result)


@functools.cache
def _token_counter(platform: str, outcome: str) -> Any:
    return metrics.marmot_tokens_total.labels(platform, outcome)


class TriggerHandler:
    """Handles gift wraps for one server key; shared by every relay connection of the process."""

    def __init__(
        self,
        key: ServerKey,
        providers: ProviderRegistry,
        dedup: Dedup,
        limits: Limits,
        in_flight: int,
        *,
        apns: ApnsPayload = SILENT,
        health: PushHealth | None = None,
    ) -> None:
        self._key, self._dedup = key, dedup
        self._dispatcher = Dispatcher(providers, in_flight, apns, health)
        self._global = RateLimiter(limits.global_)
        self._chunks = RateLimiter(limits.chunk)
        self._devices = RateLimiter(limits.device)
        self._cpu = CpuTurns()  # unwrapping and decryption, a slice per loop iteration
        # Ids of gift wraps that unwrapped: the same event from a second relay costs nothing.
        self._unwrapped = RecentDigests(600.0)

    async def handle(self, event: Mapping[str, Any]) -> TriggerResult:
        result = await self._admit(event)
        count_trigger(result)
        return result

    async def _admit(self, event: Mapping[str, Any]) -> TriggerResult:
        content = await self._cpu.run(functools.partial(self._unwrap, event))
        if isinstance(content, TriggerResult):
            return content
        if not await self._dedup.first_time(hashlib.sha256(content).digest()):
            return TriggerResult.DUPLICATE
        await self._send_chunks(content)
        return TriggerResult.ACCEPTED

    def _unwrap(self, event: Mapping[str, Any]) -> bytes | TriggerResult:
        """Steps 1 to 3, in one piece: the same wrap from another relay, waiting for its turn
        meanwhile, then finds it unwrapped."""
        wrap_id = str(event.get("id")).encode()
        if self._unwrapped.contains(wrap_id):
            return TriggerResult.DUPLICATE
        if not self._global.charge():
            return TriggerResult.RATE_LIMITED
        try:
            content = unwrap_trigger(event, self._key)
        except Refused:
            return TriggerResult.INVALID
        self._unwrapped.add(wrap_id)
        return content

    async def _send_chunks(self, content: bytes) -> None:
        await self._send_all(await self._cpu.run(functools.partial(self._tokens_of, content)))

    async def _send_all(self, tokens: list[DeviceToken]) -> None:
        if len(tokens) == 1:  # the common case: no task needed
            await self._send(tokens[0])
        else:
            await asyncio.gather(*(self._send(token) for token in tokens))

    def _tokens_of(self, content: bytes) -> list[DeviceToken]:
        chunks = dict.fromkeys(split_chunks(content))  # a chunk repeated is sent once
        return [token for token in map(self._admit_chunk, chunks) if token is not None]

    def _admit_chunk(self, chunk: bytes) -> DeviceToken | None:
        """The chunk's token once the chunk's and the device's limits are charged; None (counted) for
        a chunk refused, padding, or a device over its limit."""
        if not self._chunks.charge(hashlib.sha256(chunk).digest()):
            _count_token("unknown", "rate_limited")
            return None
        try:
            token = decrypt_token(self._key.secret, chunk)
        except TokenError:
            _count_token("unknown", "invalid")
            return None
        device = bytes([token.platform]) + token_bytes(token.platform, token.token)
        if not self._devices.charge(hashlib.sha256(device).digest()):
            _count_token(channel_of(token), "rate_limited")
            return None
        return token

    async def _send(self, token: DeviceToken) -> None:
        _count_token(channel_of(token), await self._dispatcher.send(token))


def _device_of(token: DeviceToken) -> bytes:
    return bytes([token.platform]) + token_bytes(token.platform, token.token)


class SharedTriggerHandler(TriggerHandler):
    """The handler of a process sharing its key's gift wraps through Redis (app.marmot.wrap_queue),
    with every other process serving the key. A wrap taken from the shared queue was claimed once and
    charged to the global budget when it was queued; the duplicate memory and the chunk and device
    tiers are in Redis (app.marmot.shared_limits), charged in the same order as `TriggerHandler`'s.
    When Redis does not answer, this process's own limits and memory stand in (logged once)."""

    def __init__(self, *args: Any, shared: SharedLimits, **kwargs: Any) -> None:
        """`TriggerHandler`'s arguments, and the limits and duplicate memory in Redis."""
        super().__init__(*args, **kwargs)
        self._shared = shared
        self._redis_failing = False

    async def handle_frame(self, text: str, entry: str | None) -> TriggerResult:
        """A relay's frame holding a gift wrap: taken from the shared queue (`entry` is its stream
        entry), or come while Redis was away (None) and handled by this process alone."""
        if entry is None:
            event = event_of_frame(text)
            if event is not None:
                return await self.handle(event)
            result = TriggerResult.INVALID
        else:
            result = await self._admit_shared(text, entry)
        count_trigger(result)
        return result

    async def _admit_shared(self, text: str, entry: str) -> TriggerResult:
        content = await self._cpu.run(functools.partial(self._open_frame, text))
        if isinstance(content, TriggerResult):
            return content
        chunks = list(dict.fromkeys(split_chunks(content)))  # a chunk repeated is sent once
        admitted = await self._first_time_then_chunks(content, chunks, entry)
        if admitted is None:
            return TriggerResult.DUPLICATE
        tokens = await self._cpu.run(functools.partial(self._decrypt_admitted, chunks, admitted))
        await self._send_all(await self._within_device_limits(tokens))
        return TriggerResult.ACCEPTED

    def _open_frame(self, text: str) -> bytes | TriggerResult:
        event = event_of_frame(text)
        if event is None:
            return TriggerResult.INVALID
        try:
            return unwrap_trigger(event, self._key)
        except Refused:
            return TriggerResult.INVALID

    async def _first_time_then_chunks(
        self, content: bytes, chunks: list[bytes], entry: str
    ) -> list[bool] | None:
        try:
            admitted = await self._shared.first_time_then_chunks(content, chunks, entry)
        except (RedisError, OSError) as error:
            self._note_redis(error)
            if not await self._dedup.first_time(hashlib.sha256(content).digest()):
                return None
            return [self._chunks.charge(hashlib.sha256(chunk).digest()) for chunk in chunks]
        self._note_redis(None)
        return admitted

    def _decrypt_admitted(self, chunks: list[bytes], admitted: list[bool]) -> list[DeviceToken]:
        tokens = []
        for chunk, within in zip(chunks, admitted, strict=True):
            if not within:
                _count_token("unknown", "rate_limited")
                continue
            try:
                tokens.append(decrypt_token(self._key.secret, chunk))
            except TokenError:
                _count_token("unknown", "invalid")
        return tokens

    async def _within_device_limits(self, tokens: list[DeviceToken]) -> list[DeviceToken]:
        devices = [_device_of(token) for token in tokens]
        try:
            within = await self._shared.charge_devices(devices)
        except (RedisError, OSError) as error:
            self._note_redis(error)
            within = [self._devices.charge(hashlib.sha256(device).digest()) for device in devices]
        else:
            self._note_redis(None)
        for token, ok in zip(tokens, within, strict=True):
            if not ok:
                _count_token(channel_of(token), "rate_limited")
        return [token for token, ok in zip(tokens, within, strict=True) if ok]

    def _note_redis(self, error: BaseException | None) -> None:
        if (error is not None) == self._redis_failing:
            return
        self._redis_failing = error is not None
        if error is not None:
            log.warning(
                "Marmot limits: Redis unavailable (%s); this process's own limits apply", type(error).__name__
            )
        else:
            log.info("Marmot limits: Redis answers again; the shared limits apply")
