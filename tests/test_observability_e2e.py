"""Every process of the production layout scraped: `api`, two `worker`s and `listen` run as real child
processes of the console script on PostgreSQL and Redis, against the local APNs, a webhook receiver
and a local xmtpd node. Envelopes come from the node through the listener; deliveries succeed, fail
for good, fail until the retries run out, find their target gone, and have their credentials
refused; a stream nobody reads holds a backlog. Each process's /metrics must tell what it caused."""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import grpc
import httpx
import pytest
from redis.asyncio import Redis

from app import __version__
from app.proto.xmtp.backend.v1 import notification_pb2_grpc
from app.queue.redis_calls import stream_key
from fakes import fake_xmtpd
from fakes.fake_apns import FakeApns
from fakes.fake_xmtpd import FakeXmtpd
from fakes.tls import TlsFiles
from fakes.webhook_receiver import Receiver
from tests.support import pipeline as pipeline_support
from tests.support.ops import channel_env, register
from tests.support.pipeline import metric, parse_metrics
from tests.support.process import Child, child, wait_answering

redis_url = pipeline_support.redis_url

SERVING = re.compile(r"serving http=\S*:(\d+) grpc=\S*:(\d+)")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
LAG_SECONDS = 120  # how old the node's envelopes are when the listener reads them
BACKLOG = 3  # entries on a stream no worker reads (FCM is not configured)
SETTLE_SECONDS = 40.0


@pytest.fixture
async def node() -> AsyncIterator[FakeXmtpd]:
    async with FakeXmtpd(keepalive_seconds=1.0) as started:
        yield started


async def scrape(client: httpx.AsyncClient, port: int) -> tuple[Samples, str]:
    response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    return parse_metrics(response.text), response.text


def total(scrapes: list[Samples], name: str, **labels: str) -> float:
    return sum(metric(samples, name, **labels) for samples in scrapes)


async def test_every_process_tells_what_it_caused(
    postgresql_url: str,
    redis_url: str,
    receiver: Receiver,
    apns_server: FakeApns,
    tls: TlsFiles,
    node: FakeXmtpd,
) -> None:
    apns_server.reset()
    env = channel_env(
        postgresql_url,
        apns_endpoint=apns_server.endpoint,
        apns_ca_file=tls.ca_file,
        redis_url=redis_url,
        http_port="0",
        grpc_port="0",
        metrics_port="0",
        max_attempts="3",
        retry_base_seconds="0.05",
        xmtpd_address=node.address,
        xmtpd_tls="false",
    )
    redis = Redis.from_url(redis_url)
    async with AsyncExitStack() as stack, httpx.AsyncClient(timeout=10) as client:
        stack.push_async_callback(redis.aclose)
        await redis.xadd(stream_key("deliveries.fcm", 0), {"p": b"nobody reads this"})
        api = await stack.enter_async_context(child("api", ["api"], env))
        workers = [await stack.enter_async_context(child(f"worker-{n}", ["worker"], env)) for n in (1, 2)]
        listener = await stack.enter_async_context(child("listen", ["listen"], env))
        http_port, grpc_port = (int(p) for p in (await api.line(SERVING)).groups())
        ports = {"api": http_port} | {c.name: await c.probe_port() for c in (*workers, listener)}
        for name, port in ports.items():
            ready = await wait_answering(f"http://127.0.0.1:{port}/readyz")
            assert ready.status_code == 200, (name, ready.text)

        # Recipients of one group topic on two channels, each answering its own way.
        topic = fake_xmtpd.group_topic()
        hooks = {
            "ok": receiver.endpoint([200]),
            "gone": receiver.endpoint([410]),
            "failing": receiver.endpoint([500]),
            "refused": receiver.endpoint([400]),
        }
        tokens = {"ok": f"ok.{secrets.token_hex(8)}", "forbidden": f"forbidden.{secrets.token_hex(8)}"}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = notification_pb2_grpc.NotificationServiceStub(channel)
            registered = [await register(stub, "http", h.url, h.key, [topic]) for h in hooks.values()]
            registered += [await register(stub, "apns", t, topics=[topic]) for t in tokens.values()]

        # Old envelopes from the node, through the listener; two more on the backlog stream.
        sent_ns = time.time_ns() - LAG_SECONDS * 1_000_000_000
        await node.wait_for(lambda: node.open_streams >= 1, 20, "the listener's firehose stream")
        node.publish([fake_xmtpd.group_message(100, 1, topic, originator_ns=sent_ns)])
        for _ in range(BACKLOG - 1):
            await redis.xadd(stream_key("deliveries.fcm", 0), {"p": b"nor this"})

        expected = {
            ("http", "delivered"): 1,
            ("http", "dead"): 1,
            ("http", "failed"): 1,
            ("http", "rejected"): 1,
            ("apns", "delivered"): 1,
            ("apns", "rejected"): 1,
        }
        scrapes = await settled(client, workers, expected)
        api_samples, api_text = await scrape(client, ports["api"])
        listener_samples, listener_text = await scrape(client, ports["listen"])
        worker_texts = [(await scrape(client, ports[w.name]))[1] for w in workers]

        # Deliveries: each worker counts its own; together, exactly what happened.
        for (channel_name, outcome), count in expected.items():
            assert (
                total(scrapes, "xmtp_push_deliveries_total", channel=channel_name, outcome=outcome) == count
            )
        # Attempts: one each, but three at the gone webhook and three at the failing one.
        assert total(scrapes, "xmtp_push_delivery_seconds_count", channel="http") == 8
        assert total(scrapes, "xmtp_push_delivery_seconds_count", channel="apns") == 2
        assert total(scrapes, "xmtp_push_retries_total", channel="http") == 4
        assert total(scrapes, "xmtp_push_retries_total", channel="apns") == 0
        # APNs refused the credentials once (403 InvalidProviderToken): counted by the worker that saw
        # it, which holds connections and a token signed moments ago.
        assert total(scrapes, "xmtp_push_credentials_refused_total", channel="apns", app="default") == 1
        refused_by = [
            s
            for s in scrapes
            if metric(s, "xmtp_push_credentials_refused_total", channel="apns", app="default")
        ]
        assert total(scrapes, "xmtp_push_provider_connects_total", channel="apns", app="default") >= 1
        assert 0 < metric(refused_by[0], "xmtp_push_apns_token_age_seconds", app="default") < 600
        assert metric(refused_by[0], "xmtp_push_provider_connections", channel="apns", app="default") >= 1

        # The listener: the envelope seen and queued, its age as lag, the stream live.
        assert metric(listener_samples, "xmtp_push_listener_envelopes_total", kind="group_message") == 1
        assert metric(listener_samples, "xmtp_push_envelopes_total", result="ingested") == 1
        assert LAG_SECONDS <= metric(listener_samples, "xmtp_push_listener_lag_seconds") < LAG_SECONDS + 30
        assert metric(listener_samples, "xmtp_push_listener_state") == 2
        assert metric(listener_samples, "xmtp_push_listener_lag_envelopes") == 0  # its cursor is stored
        assert total(scrapes, "xmtp_push_envelopes_total", result="fanned_out") == 1

        # The backlog, from every process alike: any one target tells it.
        for samples in (api_samples, listener_samples, *scrapes):
            assert metric(samples, "xmtp_push_queue_depth", queue="deliveries.fcm") == BACKLOG
            assert metric(samples, "xmtp_push_queue_depth", queue="deliveries.http") == 0
            assert metric(samples, "xmtp_push_queue_oldest_seconds", queue="deliveries.fcm") > 0
            assert metric(samples, "xmtp_push_retries_waiting") == 0
            assert metric(samples, "xmtp_push_build_info", version=__version__) == 1

        # The API's status page tells the whole deployment: the listener live with its lag, the
        # refused credentials, and the failures apart from the deliveries.
        rows = [
            '<tr><td>apns</td><td class="bad">credentials refused (1 in the last hour)</td><td>1</td><td>1</td></tr>',
            '<tr><td>http</td><td class="bad">failing (2 of 4 failed or rejected)</td><td>1</td><td>3</td></tr>',
        ]
        page = await status_page(client, ports["api"], rows)
        # The listener tells its state when it changes and with its marks, and again every 10 s: the
        # page may show a report from before the old envelope came, so wait for one after it.
        deadline = time.monotonic() + 15
        while not lagging(page) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            page = await status_page(client, ports["api"], rows)
        assert lagging(page), page

        # Nothing anybody registered is in any label.
        for text in (api_text, listener_text, *worker_texts):
            for value in [r.target for r in registered] + [r.rid.hex() for r in registered]:
                assert value not in text
            assert topic.hex() not in text and str(receiver.port) not in text

        for process in (listener, *workers, api):
            assert await process.stop() == 0, process.output()


async def settled(
    client: httpx.AsyncClient, workers: list[Child], expected: dict[tuple[str, str], int]
) -> list[Samples]:
    """The workers' scrapes once their final outcomes add up to `expected` and the webhook queue
    they drained shows empty: a worker acknowledges in batches, so an entry whose outcome is counted
    can stay queued a moment longer."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        scrapes = [(await scrape(client, await w.probe_port()))[0] for w in workers]
        found = {
            key: total(scrapes, "xmtp_push_deliveries_total", channel=key[0], outcome=key[1])
            for key in expected
        }
        drained = all(
            metric(s, "xmtp_push_queue_depth", queue="deliveries.http") == 0
            and metric(s, "xmtp_push_retries_waiting") == 0
            for s in scrapes
        )
        if found == expected and drained:
            return scrapes
        if time.monotonic() > deadline:
            outputs = "\n".join(w.output() for w in workers)
            raise AssertionError(f"outcomes {found}, want {expected}\n{outputs}")
        await asyncio.sleep(0.2)


def lagging(page: str) -> bool:
    """Whether the status page shows the listener live and lagging by the old envelopes' age."""
    words = re.search(r'<p id="listener" class="ok">xmtpd: live, lag ([0-9.]+) s', page)
    return words is not None and float(words.group(1)) >= LAG_SECONDS


async def status_page(client: httpx.AsyncClient, port: int, rows: list[str]) -> str:
    """/status once it shows `rows` (workers add their outcomes to it once a second)."""
    deadline = time.monotonic() + 10
    while True:
        page = (await client.get(f"http://127.0.0.1:{port}/status")).text
        if all(row in page for row in rows):
            return page
        assert time.monotonic() < deadline, page[page.find("<h2>Channels</h2>") :][:1500]
        await asyncio.sleep(0.2)
