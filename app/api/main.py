"""The HTTP application: Connect routes for NotificationService, health and metrics."""

from __future__ import annotations

from fastapi import FastAPI

from app import __version__
from app.api import connect, health, ingest, status
from app.runtime import Runtime

DESCRIPTION = (
    "Push backend for XMTP. SDKs register recipients and their topic subscriptions through "
    "`xmtp.backend.v1.NotificationService`, over gRPC on the gRPC port or over the Connect "
    "protocol on the routes below."
)


def create_app(runtime: Runtime | None = None) -> FastAPI:
    """Build the app around a started runtime (None only to render the OpenAPI document)."""
    app = FastAPI(title="xmtp-push", version=__version__, description=DESCRIPTION)
    app.state.runtime = runtime
    if runtime is not None:
        app.state.probes = runtime.probes("database", "redis")
    app.include_router(connect.router)
    app.include_router(ingest.router)
    app.include_router(health.router)
    app.include_router(status.router)
    return app
