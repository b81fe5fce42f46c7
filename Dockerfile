# xmtp-push: one image for every command (api, worker, listen, migrate, and the operator commands).
#   docker build -t xmtp-push .
#   docker run --rm -p 8080:8080 -p 50051:50051 -e XMTP_PUSH_DATABASE_URL=postgresql+asyncpg://... xmtp-push
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /srv/xmtp-push

# Dependencies (at the versions of requirements.lock) and package in one layer, built from a copy of
# the sources that is removed after: the installed package carries its migrations
# (share/xmtp-push/alembic), so `migrate` needs no tree.
COPY pyproject.toml README.md requirements.lock /tmp/xmtp-push/
COPY app /tmp/xmtp-push/app
COPY workers /tmp/xmtp-push/workers
COPY alembic /tmp/xmtp-push/alembic
RUN pip install -c /tmp/xmtp-push/requirements.lock /tmp/xmtp-push \
    && rm -rf /tmp/xmtp-push \
    && useradd --system --uid 10001 --home-dir /srv/xmtp-push xmtp-push \
    && chown xmtp-push /srv/xmtp-push

USER xmtp-push

# Listen on every interface inside the container; publish the ports to choose who reaches them.
ENV XMTP_PUSH_HTTP_HOST=0.0.0.0 \
    XMTP_PUSH_HTTP_PORT=8080 \
    XMTP_PUSH_GRPC_HOST=0.0.0.0 \
    XMTP_PUSH_GRPC_PORT=50051

# 9464: `worker` and `listen` serve /healthz, /readyz and /metrics there (XMTP_PUSH_METRICS_PORT).
EXPOSE 8080 50051 9464

# Readiness on the port of the command the container runs: XMTP_PUSH_HTTP_PORT for api, dev, gateway
# and marmot, XMTP_PUSH_METRICS_PORT for worker and listen.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
    CMD ["xmtp-push", "healthcheck"]

ENTRYPOINT ["xmtp-push"]
CMD ["api"]
