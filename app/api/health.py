"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio

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
    try:
        ready = await asyncio.wait_for(runtime.database_ready(), READY_CHECK_SECONDS)
    except TimeoutError:
        ready = False
    checks = {"database": "ok" if ready else "unavailable"}
    return JSONResponse({"status": "ok" if ready else "unavailable", "checks": checks}, 200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
