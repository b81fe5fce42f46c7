"""Benchmark: the schema and the fan-out at scale, 1M to 100M subscriptions (`make bench-scale`).
Builds N subscriptions over N/10 recipients server-side (most topics of 2 to 10 subscribers, a few of 100k
to 1M; keys by MD5: key order is not load order), then measures fan-out pages on the largest topic at random
keyset positions and on small topics, `bench.registration` on it, the time --workers workers take to queue
a delivery per subscriber of the largest topic, the sizes on disk. Flushes XMTP_PUSH_BENCH_REDIS (DB 11)."""

import argparse
import asyncio
import hashlib
import os
import random
import secrets
import subprocess
import sys
import time
from typing import NamedTuple

import asyncpg
from redis.asyncio import Redis

from app.core.channels import Channel
from app.core.config import load_settings
from app.core.database import create_engine, create_session_factory
from app.envelopes.types import Envelope, EnvelopeKind
from app.fanout.service import enqueue_envelopes
from app.queue.base import delivery_stream
from app.recipients.repository import subscribers_page
from app.runtime import open_runtime
from bench import _support as support
from bench._support import Results, asyncpg_dsn, bench_database, environment_line, verdict

REDIS_URL = os.environ.get("XMTP_PUSH_BENCH_REDIS", "redis://127.0.0.1:6379/11")
STRIDE = 1_000_003  # prime: j * STRIDE mod R is distinct for j < R unless R is a multiple of it
CHUNK_TOPICS = 500_000  # small topics per INSERT (about 3M rows): progress every few seconds
PAGE, SAMPLES, WARM_UP = 1000, 1000, 100
SMALL_TOPIC_SQL = """
INSERT INTO subscriptions (topic, recipient_id, start_ns, include_commits)
SELECT '\\x00'::bytea || decode(md5('t' || t), 'hex'),
       decode(repeat(md5('r' || ((t * 7919 + j * {stride}) % {recipients})), 2), 'hex'), 0, false
FROM generate_series({low}::bigint, {high}::bigint - 1) AS t, generate_series(0, 1 + (t % 9)::int) AS j
"""
LARGE_TOPIC_SQL = """
INSERT INTO subscriptions (topic, recipient_id, start_ns, include_commits)
SELECT '\\x00'::bytea || decode(md5('h' || {k}), 'hex'),
       decode(repeat(md5('r' || (({k} * 104729 + j * {stride}) % {recipients})), 2), 'hex'), 0, false
FROM generate_series(0::bigint, {size} - 1) AS j
"""
RECIPIENTS_SQL = """
INSERT INTO recipients (id, secret_hash, channel, target, signing_key, topic_count, created_ns, renewed_ns)
SELECT decode(repeat(md5('r' || i), 2), 'hex'), decode(repeat('00', 32), 'hex'), 3,
       'https://hooks.example.org/hint', '\\x{key}'::bytea, 0, {now}, {now} - (i % 86400) * 1000000000
FROM generate_series({low}::bigint, {high}::bigint - 1) AS i
"""
FK = "fk_subscriptions_recipient_id_recipients"  # the subscriptions' keys: dropped for the load, built after
DROP_KEYS = f"""ALTER TABLE subscriptions DROP CONSTRAINT {FK}, DROP CONSTRAINT pk_subscriptions;
DROP INDEX ix_subscriptions_recipient_id"""
SORTED = "SET maintenance_work_mem = '2GB'; SET max_parallel_maintenance_workers = 1;"
PRIMARY_KEY = f"""{SORTED} ALTER TABLE subscriptions
ADD CONSTRAINT pk_subscriptions PRIMARY KEY (topic, recipient_id)"""
RECIPIENT_INDEX = f"{SORTED} CREATE INDEX ix_subscriptions_recipient_id ON subscriptions (recipient_id)"
FOREIGN_KEY = f"""ALTER TABLE subscriptions ADD CONSTRAINT {FK} FOREIGN KEY (recipient_id)
REFERENCES recipients (id) ON DELETE CASCADE NOT VALID; ALTER TABLE subscriptions VALIDATE CONSTRAINT {FK}"""
TABLES = ("recipients", "subscriptions")
INDEXES = ("pk_recipients", "ix_recipients_renewed_ns", "pk_subscriptions", "ix_subscriptions_recipient_id")
RELATIONS = (*TABLES, *INDEXES)


class Shape(NamedTuple):
    large: list[int]  # the large topics' subscribers, the largest first
    recipients: int
    small_topics: int  # of 2 to 10 subscribers, 6 on average


def shape_of(subscriptions: int) -> Shape:
    many = subscriptions >= 50_000_000
    large = [1_000_000, 500_000, 250_000, 100_000, 100_000] if many else [max(1000, subscriptions // 10)]
    recipients = max(subscriptions // 10, large[0])
    if recipients % STRIDE == 0:
        raise SystemExit(f"{recipients:,} recipients, a multiple of {STRIDE}: pick another --subscriptions")
    return Shape(large, recipients, max(1, (subscriptions - sum(large)) // 6))


def spans(total: int, step: int) -> list[tuple[int, int]]:
    return [(low, min(total, low + step)) for low in range(0, total, step)]


def inserts(shape: Shape) -> list[tuple[str, str]]:
    """(SQL, label): the recipients in four parts, each large topic, the small topics in chunks."""
    values, made = {"stride": STRIDE, "recipients": shape.recipients, "key": secrets.token_hex(32)}, []
    values["now"] = time.time_ns()
    for low, high in spans(shape.recipients, max(1, shape.recipients // 4)):
        made.append((RECIPIENTS_SQL.format(low=low, high=high, **values), f"recipients {low:,}-{high:,}"))
    for k, size in enumerate(shape.large):
        made.append((LARGE_TOPIC_SQL.format(k=k, size=size, **values), f"topic of {size:,}"))
    for low, high in spans(shape.small_topics, CHUNK_TOPICS):
        made.append((SMALL_TOPIC_SQL.format(low=low, high=high, **values), f"small topics {low:,}-{high:,}"))
    return made


def topic(prefix: str, n: int) -> bytes:  # as the SQL above: prefix 't' for small topics, 'h' for large ones
    return b"\x00" + hashlib.md5(f"{prefix}{n}".encode()).digest()


async def in_parallel(pool: asyncpg.Pool, statements: list[tuple[str, str]]) -> None:
    async def lane() -> None:  # takes the (SQL, label) statements from the list in order
        while statements:
            (sql, label), started = statements.pop(0), time.monotonic()
            await pool.execute(sql)
            print(f"  {label}: {time.monotonic() - started:.1f} s", file=sys.stderr)

    await asyncio.gather(lane(), lane())


async def build(dsn: str, shape: Shape) -> float:
    """Load the rows, then build the subscriptions' keys and VACUUM ANALYZE; returns the seconds it took."""
    started = time.monotonic()
    off = {"synchronous_commit": "off"}  # on both connections, for the whole build
    async with asyncpg.create_pool(dsn, min_size=2, max_size=2, server_settings=off) as pool:  # no timeout
        await pool.execute(DROP_KEYS)
        await in_parallel(pool, inserts(shape))
        print(f"  rows loaded in {time.monotonic() - started:.0f} s", file=sys.stderr)
        await in_parallel(pool, [(PRIMARY_KEY, "primary key"), (RECIPIENT_INDEX, "recipient index")])
        await in_parallel(pool, [(FOREIGN_KEY, "foreign key")])
        await in_parallel(pool, [(f"VACUUM ANALYZE {table}", f"vacuum {table}") for table in TABLES])
    return time.monotonic() - started


async def stored(dsn: str) -> tuple[dict[str, int], dict[str, int], str]:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        sql = "SELECT relname, pg_relation_size(oid) AS bytes FROM pg_class WHERE relname = ANY($1::text[])"
        sizes = {row["relname"]: int(row["bytes"]) for row in await pool.fetch(sql, RELATIONS)}
        rows = {table: await pool.fetchval(f"SELECT count(*) FROM {table}") for table in TABLES}
        return sizes, rows, await pool.fetchval("SHOW shared_buffers")


async def page_latencies(url: str, shape: Shape) -> list[list[float]]:
    """p50 and p99 ms of a page of the largest topic at a random keyset position, and of a small topic."""
    engine, rng = create_engine(load_settings(database_url=url)), random.Random(7)
    large, small = list[float](), list[float]()
    sessions = create_session_factory(engine.execution_options(isolation_level="AUTOCOMMIT"))
    try:
        async with sessions() as session:
            for _ in range(WARM_UP + SAMPLES):  # the warm-up fills the connection's statement cache
                small_topic = topic("t", rng.randrange(shape.small_topics))
                for latencies, where in ((large, topic("h", 0)), (small, small_topic)):
                    after, started = rng.randbytes(32) if latencies is large else b"", time.perf_counter()
                    rows = await subscribers_page(session, where, after, PAGE)
                    latencies.append(time.perf_counter() - started)
                    assert rows or latencies is large, "a small topic answered no subscriber"
    finally:
        await engine.dispose()
    return [
        [support.percentile(sorted(pages[WARM_UP:]), pct) * 1000 for pct in (50, 99)]
        for pages in (large, small)
    ]


async def queue_time(url: str, size: int, workers: int) -> float:
    """Seconds from queueing one envelope for the largest topic until its deliveries are all queued."""
    await flush()  # before the workers record the partition count, and after
    envelope = Envelope(topic("h", 0), 1, time.time_ns(), EnvelopeKind.GROUP_MESSAGE, should_push=True)
    env = support.server_env(url, REDIS_URL=REDIS_URL, WEBHOOK_ENABLED="false")
    async with open_runtime(load_settings(database_url=url, redis_url=REDIS_URL), sends=False) as runtime:
        assert runtime.queue is not None
        procs = [
            await support.start_xmtp_push(f"worker-{n}", env, support.WORKER_READY) for n in range(workers)
        ]
        try:
            started = time.monotonic()
            await enqueue_envelopes(runtime.queue, [envelope])
            async with asyncio.timeout(600):
                while await runtime.queue.depth(delivery_stream(Channel.HTTP)) < size:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            return time.monotonic() - started
        finally:
            await asyncio.gather(*(support.stop_process(proc) for proc in procs))
            await flush()


async def flush() -> None:
    async with Redis.from_url(REDIS_URL) as client:
        await client.flushdb()


def registration(url: str, duration: float) -> list[list[str]]:
    """The Register and UpdateSubscriptions rows of `bench.registration`'s table, run on this database."""
    command = [sys.executable, "-m", "bench.registration", "--database-url", url, "--duration", str(duration)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in output.splitlines()]
    return [row for row in rows if len(row) == 4 and row[0].startswith(("Register", "UpdateSubscriptions"))]


async def measure(url: str, shape: Shape, args: argparse.Namespace, built: float | None) -> None:
    sizes, rows, shared_buffers = await stored(asyncpg_dsn(url))
    (large_p50, large_p99), (small_p50, small_p99) = await page_latencies(url, shape)
    queued, largest = await queue_time(url, shape.large[0], args.workers), shape.large[0]
    counts = f"{rows['subscriptions']:,} subscriptions, {rows['recipients']:,} recipients"
    results = Results(f"scale: {counts}, shared_buffers {shared_buffers}")
    results.add("build", "" if built is None else f"{built:.0f} s")
    for name in RELATIONS:
        results.add(f"size of {name}", f"{sizes.get(name, 0) / 2**20:,.0f} MiB")
    large, on_largest = f"p50 {large_p50:.2f} ms, p99 {large_p99:.2f} ms", f"{largest:,}-subscriber topic"
    results.add(f"page of {PAGE:,}, {on_largest}", large, "p99 < 20 ms", verdict(large_p99 < 20))
    results.add(f"page of {PAGE:,}, 2-10 subscriber topic", f"p50 {small_p50:.2f} ms, p99 {small_p99:.2f} ms")
    queued_by = f"{largest:,} deliveries queued by {args.workers} workers"  # the target, pro rata
    results.add(queued_by, f"{queued:.1f} s", "1M in < 15 s", verdict(queued * 1e6 / largest < 15))
    for row in registration(url, args.duration):
        results.add(*row)
    results.print()


async def main(args: argparse.Namespace) -> None:
    print(environment_line())
    print(shape := shape_of(args.subscriptions))
    if args.database_url:
        return await measure(args.database_url, shape, args, built=None)
    async with bench_database(keep=args.keep_db) as url:
        await measure(url, shape, args, await build(asyncpg_dsn(url), shape))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--subscriptions", type=int, default=1_000_000, help="subscriptions to build")
    parser.add_argument("--workers", type=int, default=2, help="worker processes fanning the large topic out")
    parser.add_argument("--duration", type=float, default=10.0, help="measured Register seconds")
    parser.add_argument("--database-url", help="measure this database, as an earlier --keep-db run built it")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database")
    asyncio.run(main(parser.parse_args()))
