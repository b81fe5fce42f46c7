"""Liveness, readiness and Prometheus metrics: the three routes every long-running command serves.

A process's app sets `app.state.probes` (app/core/probes.py) to say what its readiness checks and
which gauges are read just before a scrape; `create_probe_app` is the whole HTTP side of a process
that serves nothing else (a worker, the listener).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app import __version__
from app.core.probes import Probes

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: 200 while the process runs")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: 200 only when the process's dependencies answer (the database, and Redis when configured)",
    responses={503: {"description": "a dependency does not answer"}},
)
async def readyz(request: Request) -> JSONResponse:
    checks = await _probes(request).readiness()
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse({"status": "ok" if ready else "unavailable", "checks": checks}, 200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
async def metrics(request: Request) -> Response:
    await _probes(request).sample_gauges()
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def _probes(request: Request) -> Probes:
    probes = getattr(request.app.state, "probes", None)
    return probes if isinstance(probes, Probes) else Probes()


def create_probe_app(probes: Probes) -> FastAPI:
    """An app serving only /healthz, /readyz and /metrics (no documentation routes)."""
    app = FastAPI(
        title="xmtp-push probes", version=__version__, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.probes = probes
    app.include_router(router)
    return app
