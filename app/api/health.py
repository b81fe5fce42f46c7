"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

READY_CHECK_SECONDS = 2.0

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: 200 while the process runs")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: 200 only when the database (and Redis, when configured) answer",
    responses={503: {"description": "a dependency does not answer"}},
)
async def readyz(request: Request) -> JSONResponse:
    runtime = request.app.state.runtime
    checks = {"database": await _check(runtime.database_ready())}
    if runtime.settings.redis_url:
        checks["redis"] = await _check(runtime.queue_ready())
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse({"status": "ok" if ready else "unavailable", "checks": checks}, 200 if ready else 503)


async def _check(probe: Awaitable[bool]) -> str:
    try:
        ok = await asyncio.wait_for(probe, READY_CHECK_SECONDS)
    except TimeoutError:
        ok = False
    return "ok" if ok else "unavailable"


@router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
