"""The notification service's methods, shared by the gRPC and Connect transports.

A transport hands over a decoder for the request; this module turns the
message into a domain command, runs the service inside one transaction bounded
by the call's deadline, and renders the answer. The transaction is committed
here, at the edge, or rolled back when the call fails or runs out of time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession

from app.api import messages
from app.core import errors, metrics
from app.core.errors import Code, DomainError
from app.core.growth import UNLIMITED, Growth
from app.ops.failures import tell_or_log
from app.proto.xmtp.backend.v1 import notification_pb2 as pb
from app.quotas.quotas import Quotas
from app.recipients import service
from app.runtime import Runtime

SERVICE_NAME = "xmtp.backend.v1.NotificationService"
log = logging.getLogger(__name__)
T = TypeVar("T")
Decoder = Callable[[type[Message]], Message]
# Said once per change of the database's state, after what is wrong with it.
ANSWERING_UNAVAILABLE = "calls answer UNAVAILABLE until it serves"


def no_topic_changes(request: Message) -> int:
    return 0


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    request_type: type[Message]
    response_type: type[Message]
    # `Growth`: told of each recipient or installation the call creates (the new-recipients quota).
    run: Callable[[Runtime, AsyncSession, Message, Growth], Awaitable[Message]]
    service: str = SERVICE_NAME
    # The subscription adds and removes a request asks for (the topic-changes quota).
    topic_changes: Callable[[Message], int] = no_topic_changes

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


@dataclass(frozen=True, slots=True)
class CallQuota:
    """The quotas a call is charged to, and who its caller is (asked only when a caller is counted)."""

    quotas: Quotas
    caller: Callable[[], str]


async def _register(runtime: Runtime, session: AsyncSession, request: Message, growth: Growth) -> Message:
    command = messages.register_command(request)  # type: ignore[arg-type]
    return messages.state_message(await service.register(session, runtime.rules, command, growth))


async def _unregister(runtime: Runtime, session: AsyncSession, request: Message, growth: Growth) -> Message:
    await service.unregister(session, messages.unregister_command(request))  # type: ignore[arg-type]
    return pb.UnregisterResponse()


async def _update(runtime: Runtime, session: AsyncSession, request: Message, growth: Growth) -> Message:
    command = messages.update_command(request)  # type: ignore[arg-type]
    return messages.state_message(await service.update_subscriptions(session, runtime.rules, command))


METHODS = {
    m.name: m
    for m in (
        Method("Register", pb.RegisterRequest, pb.RecipientState, _register),
        Method("Unregister", pb.UnregisterRequest, pb.UnregisterResponse, _unregister),
        Method(
            "UpdateSubscriptions",
            pb.UpdateSubscriptionsRequest,
            pb.RecipientState,
            _update,
            topic_changes=lambda request: len(request.adds) + len(request.removes),  # type: ignore[attr-defined]
        ),
    )
}


async def invoke(
    runtime: Runtime, method: Method, decode: Decoder, deadline: float | None, quota: CallQuota | None = None
) -> Message:
    """Decode, charge to the caller's quotas, run and render one call; raises DomainError with the
    answer's code (errors.Throttled over a quota, before anything is changed)."""
    started = time.perf_counter()
    code = "ok"
    try:
        request = _decode(method, decode)
        growth = await _charged(quota, method, request)
        return await _within_deadline(runtime, method, request, _budget(runtime, deadline), growth)
    except DomainError as error:
        code = error.code.value
        # The messages are constants (app.core.errors): they name the problem, never a value. A call
        # over a quota is told at DEBUG: the quota's own lines say when throttling starts and stops.
        level = logging.DEBUG if isinstance(error, errors.Throttled) else logging.INFO
        log.log(level, "%s answered %s: %s%s", method.name, code, error.message, _told(error.violation))
        raise
    finally:
        seconds = time.perf_counter() - started
        metrics.rpc_seconds.labels(method.name, code).observe(seconds)
        if code == "ok":
            log.debug("%s answered ok in %.1f ms", method.name, seconds * 1000)


async def _charged(quota: CallQuota | None, method: Method, request: Message) -> Growth:
    if quota is None:
        return UNLIMITED
    if quota.quotas.per_caller:
        await quota.quotas.admit(quota.caller(), method.topic_changes(request))
    return quota.quotas


def _told(violation: errors.Violation | None) -> str:
    return f" ({violation.field} {violation.description})" if violation else ""


def _decode(method: Method, decode: Decoder) -> Message:
    try:
        return decode(method.request_type)
    except DomainError:
        raise
    except Exception:
        raise errors.malformed() from None


def _budget(runtime: Runtime, deadline: float | None) -> float:
    limit = runtime.settings.request_timeout_seconds
    return limit if deadline is None else max(0.0, min(limit, deadline))


async def _within_deadline(
    runtime: Runtime, method: Method, request: Message, seconds: float, growth: Growth
) -> Message:
    async def unit_of_work() -> Message:
        async with runtime.sessions() as session, session.begin():
            return await method.run(runtime, session, request, growth)

    # The answer must not wait for the cancelled work to unwind: a driver
    # blocked in a thread (SQLite waiting on another process's write lock)
    # only notices the cancellation when its call returns. The work rolls
    # back in the background; the caller gets DEADLINE_EXCEEDED on time.
    work = asyncio.ensure_future(unit_of_work())
    try:
        done, _ = await asyncio.wait({work}, timeout=seconds)
    except asyncio.CancelledError:
        _abandon(work)
        raise
    if not done:
        _abandon(work)
        raise DomainError(Code.DEADLINE_EXCEEDED, errors.DEADLINE)
    try:
        answer = work.result()
    except DomainError:
        raise
    except Exception as error:
        bug = f"internal error during {method.name}"
        if tell_or_log(error, runtime.dependencies, ANSWERING_UNAVAILABLE, log, bug) is None:
            raise DomainError(Code.INTERNAL, "internal error") from None
        # An outage, not a bug: the SDK retries later, and the operator has read one line (per
        # change of state, not per call) naming the setting and what is wrong.
        raise DomainError(Code.UNAVAILABLE, errors.UNAVAILABLE) from None
    runtime.dependencies.up("database")
    return answer


_abandoned: set[asyncio.Future[Message]] = set()


def _abandon(work: asyncio.Future[Message]) -> None:
    """Cancel work whose answer is no longer wanted; keep it referenced until it has unwound."""
    work.cancel()
    _abandoned.add(work)
    work.add_done_callback(_forget)


def _forget(work: asyncio.Future[Message]) -> None:
    _abandoned.discard(work)
    if not work.cancelled() and not isinstance(work.exception(), DomainError | None):
        log.warning("abandoned call failed while unwinding")
