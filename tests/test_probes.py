"""/healthz, /readyz and /metrics of the processes that serve no API: `worker` and `listen` as real
child processes on XMTP_PUSH_METRICS_PORT, and the backlog gauges read from Redis at scrape time by
any process (so one scrape target tells the whole backlog)."""

from __future__ import annotations

import socket
import time

import httpx
from redis.asyncio import Redis

from app import __version__
from app.queue.redis_calls import stream_key
from app.runtime import open_runtime
from tests.support import make_settings
from tests.support import pipeline as pipeline_support
from tests.support.ops import channel_env, free_port, xmtp_push
from tests.support.pipeline import metric, parse_metrics
from tests.support.process import child, wait_answering
from workers.server import running_api

redis_url = pipeline_support.redis_url


async def test_a_worker_serves_its_probes_on_a_port_of_its_own(postgresql_url: str, redis_url: str) -> None:
    env = channel_env(postgresql_url, redis_url=redis_url, metrics_port="0")
    redis = Redis.from_url(redis_url)
    try:
        # Waiting where no worker reads (APNs is not configured here): the backlog any process tells.
        await redis.xadd(stream_key("deliveries.apns", 0), {"p": b"x"})
        async with child("worker", ["worker"], env) as worker:
            port = await worker.probe_port()
            base = f"http://127.0.0.1:{port}"
            assert (await wait_answering(f"{base}/healthz")).status_code == 200
            async with httpx.AsyncClient(base_url=base, timeout=5) as client:
                ready = await client.get("/readyz")
                assert ready.status_code == 200, ready.text
                assert ready.json() == {"status": "ok", "checks": {"redis": "ok", "providers": "ok"}}
                scraped = await client.get("/metrics")
            assert scraped.status_code == 200
            samples = parse_metrics(scraped.text)
            assert metric(samples, "xmtp_push_queue_depth", queue="deliveries.apns") == 1
            assert metric(samples, "xmtp_push_queue_oldest_seconds", queue="deliveries.apns") > 0
            assert ("xmtp_push_queue_depth", frozenset({("queue", "retries")})) in samples
            assert metric(samples, "xmtp_push_build_info", version=__version__) == 1
            assert await worker.stop() == 0, worker.output()
    finally:
        await redis.aclose()


async def test_a_worker_is_not_ready_while_redis_does_not_answer(postgresql_url: str) -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    env = channel_env(postgresql_url, redis_url=unreachable, metrics_port="0")
    async with child("worker", ["worker"], env) as worker:
        base = f"http://127.0.0.1:{await worker.probe_port()}"
        assert (await wait_answering(f"{base}/healthz")).status_code == 200
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["checks"] == {"redis": "unavailable", "providers": "ok"}
            started = time.monotonic()
            assert (await client.get("/metrics")).status_code == 200  # what it has, without the backlog
            assert time.monotonic() - started < 5
        assert await worker.stop() == 0, worker.output()


async def test_a_taken_metrics_port_stops_start_up_with_one_line(postgresql_url: str, redis_url: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = channel_env(
            postgresql_url,
            redis_url=redis_url,
            metrics_port=str(port),
            xmtpd_address=f"127.0.0.1:{free_port()}",
            xmtpd_tls="false",
        )
        result = await xmtp_push("listen", env=env)
    assert result.returncode == 3, result
    assert f"xmtp-push: metrics address 127.0.0.1:{port} is in use or cannot be bound" in result.stderr
    assert "Traceback" not in result.stderr


async def test_the_api_tells_the_backlog_it_sees_in_redis(postgresql_url: str, redis_url: str) -> None:
    settings = make_settings(postgresql_url, redis_url=redis_url)
    async with open_runtime(settings) as runtime, running_api(runtime) as servers:
        assert runtime.queue is not None
        await runtime.queue.add("envelopes", [b"a", b"b"])
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{servers.http_port}") as client:
            samples = parse_metrics((await client.get("/metrics")).text)
    assert metric(samples, "xmtp_push_queue_depth", queue="envelopes") == 2
    assert metric(samples, "xmtp_push_queue_depth", queue="deliveries.http") == 0
    assert 0 <= metric(samples, "xmtp_push_queue_oldest_seconds", queue="envelopes") < 60


async def test_a_worker_with_another_partition_count_refuses_to_start(
    postgresql_url: str, redis_url: str
) -> None:
    env = channel_env(postgresql_url, redis_url=redis_url, metrics_port="0")
    async with child("worker", ["worker"], env) as worker:  # records the default count, 64
        await worker.probe_port()
        assert await worker.stop() == 0, worker.output()
    result = await xmtp_push("worker", env={**env, "XMTP_PUSH_QUEUE_PARTITIONS": "32"})
    assert result.returncode == 2, result
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("xmtp-push: XMTP_PUSH_QUEUE_PARTITIONS: the queue in Redis has 64 partitions"), (
        last
    )
    assert redis_url not in result.stderr and "127.0.0.1" not in result.stderr
