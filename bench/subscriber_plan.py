"""Benchmark `python -m bench.subscriber_plan [--subscriptions 1000000]`: a topic's subscriber pages.

The app's page SQL is EXPLAINed for a 100,000-subscriber topic's first, middle and last full page:
subscriptions must be read through pk_subscriptions, never by a Seq Scan. Then the app's own
`subscribers_page` pages through the topic, one session and transaction per page, as the fan-out does."""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import asyncpg

from app.core.config import load_settings
from app.recipients import repository
from app.runtime import open_runtime
from bench import _support as support
from bench._support import Results, verdict

PK_INDEX = "pk_subscriptions"
PAGE_SIZE = 1000  # the fan-out's page
ORDERED = {f"Index Scan using {PK_INDEX}", f"Index Only Scan using {PK_INDEX}"}
THROUGH_PK = ORDERED | {f"Bitmap Heap Scan using {PK_INDEX}"}
Row = tuple[Any, ...]


def build_dataset(n: int) -> tuple[list[Row], list[Row], bytes]:
    """Recipient and subscription rows (in random order: heap order says nothing about key order) and the
    hot topic. For n = 1M: 120,000 recipients, 100,000 on the hot topic, 20,000 on 45 of 50,000 others."""
    rng, now_ns = random.Random(1), time.time_ns()
    hot_n, recipients_n, active_n, topics_n = n // 10, n * 12 // 100, n // 50, n // 20
    ids = [rng.randbytes(32) for _ in range(recipients_n)]
    hot_topic = b"\x00" + rng.randbytes(16)
    cold = [b"\x01" + rng.randbytes(32) for _ in range(topics_n // 10)]  # a tenth are welcome topics
    cold += [b"\x00" + rng.randbytes(16) for _ in range(topics_n - topics_n // 10)]
    key_pool = [rng.randbytes(126) for _ in range(4096)]  # three 42-byte keys, concatenated

    def row(topic: bytes, r: int) -> Row:
        start_ns = now_ns - rng.randrange(30 * 86_400 * 10**9)
        if topic[0] == 0x00:
            return (topic, ids[r], start_ns, rng.randrange(1, 5000), rng.choice(key_pool), rng.random() < 0.1)
        return (topic, ids[r], start_ns, None, None, False)

    subscriptions = [row(hot_topic, r) for r in rng.sample(range(recipients_n), hot_n)]
    per_active, remainder = divmod(n - hot_n, active_n)
    for i, r in enumerate(rng.sample(range(recipients_n), active_n)):
        subscriptions += [row(cold[t], r) for t in rng.sample(range(len(cold)), per_active + (i < remainder))]
    rng.shuffle(subscriptions)
    topic_counts = collections.Counter(s[1] for s in subscriptions)
    recipients = []
    for r, rid in enumerate(ids):  # channels APNs, FCM and HTTP (3) in turn
        target = f"https://hooks.example.com/h/{r}" if r % 3 == 2 else rng.randbytes(32).hex()
        key = rng.randbytes(32) if r % 3 == 2 else None
        recipients.append((rid, rng.randbytes(32), r % 3 + 1, target, key, topic_counts[rid], now_ns, now_ns))
    return recipients, subscriptions, hot_topic


def plan_reads(plan: dict[str, Any]) -> Iterator[tuple[str | None, str]]:
    """(table, how it is read) for each node of an EXPLAIN plan; a Bitmap Heap Scan by its index's name."""
    bitmap = plan["Node Type"] == "Bitmap Heap Scan"
    index = plan["Plans"][0].get("Index Name") if bitmap else plan.get("Index Name")
    yield plan.get("Relation Name"), f"{plan['Node Type']} using {index}" if index else plan["Node Type"]
    for child in plan.get("Plans", ()):
        yield from plan_reads(child)


async def check_page(connection: asyncpg.Connection, query: Any, allowed: set[str]) -> tuple[bool, str]:
    """Whether every read of subscriptions is allowed and no Seq Scan is anywhere; how it is read."""
    params = [query.params[name] for name in query.positiontup or ()]
    explained = await connection.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}", *params)
    top = json.loads(explained)[0]
    nodes = list(plan_reads(top["Plan"]))
    reads = [how for table, how in nodes if table == "subscriptions"]
    ok = bool(reads) and set(reads) <= allowed and all(how != "Seq Scan" for _, how in nodes)
    return ok, f"{'; '.join(reads)} ({top['Execution Time']:.2f} ms)"


async def check_plans(url: str, dialect: Any, topic: bytes, hot: list[bytes], results: Results) -> None:
    """Each page's SQL and parameters as the app sends them, compiled by its own engine's dialect."""
    middle, last = len(hot) // 2, len(hot) - PAGE_SIZE
    cases = [("first page", b"", ORDERED), (f"middle page (after #{middle})", hot[middle - 1], ORDERED)]
    cases.append((f"last full page (after #{last})", hot[last - 1], THROUGH_PK))  # a bitmap sorts: fine here
    connection = await asyncpg.connect(support.asyncpg_dsn(url))
    for title, after, allowed in cases:
        query = repository.subscribers_query(topic, after, PAGE_SIZE).compile(dialect=dialect)
        ok, reads = await check_page(connection, query, allowed)
        target = "ordered Index Scan on pk" if allowed is ORDERED else "through pk_subscriptions"
        results.add(f"plan: {title}", reads, f"{target}, no Seq Scan", verdict(ok))
    await connection.close()


async def page_app(runtime: Any, topic: bytes) -> tuple[float, list[float], list[bytes]]:
    """Through the app: a session (one transaction) per page, as fan-out runs one job per page."""
    async with runtime.sessions() as session:  # warm the pool and the statement cache
        await repository.subscribers_page(session, topic, b"", 1)
    after, pages, seen, started = b"", list[float](), list[bytes](), time.perf_counter()
    while True:
        page_started = time.perf_counter()
        async with runtime.sessions() as session, session.begin():
            rows = await repository.subscribers_page(session, topic, after, PAGE_SIZE)
        pages.append(time.perf_counter() - page_started)
        seen.extend(r.recipient_id for r in rows)
        if len(rows) < PAGE_SIZE:
            return time.perf_counter() - started, pages, seen
        after = rows[-1].recipient_id


async def main_async(n: int) -> int:
    print(f"{support.environment_line()}; PostgreSQL {await support.server_version()}")
    recipients, subscriptions, topic = build_dataset(n)
    subscribers = sorted(s[1] for s in subscriptions if s[0] == topic)
    gc.collect()
    gc.freeze()  # the dataset's millions of tuples, never rescanned: no full collection stalls the paging
    results = Results(f"subscriber pages: {len(recipients):,} recipients, {n:,} subscriptions")
    async with support.bench_database() as url:
        connection = await asyncpg.connect(support.asyncpg_dsn(url))
        copy = connection.copy_records_to_table
        await copy("recipients", records=recipients, columns=support.RECIPIENT_COLUMNS)
        await copy("subscriptions", records=subscriptions, columns=support.SUBSCRIPTION_COLUMNS)
        await connection.execute("VACUUM (ANALYZE) recipients, subscriptions")
        await connection.close()
        async with open_runtime(load_settings(database_url=url)) as runtime:
            await check_plans(url, runtime.engine.dialect, topic, subscribers, results)
            await page_app(runtime, topic)  # untimed: brings the topic's pages into PostgreSQL's buffers
            total, pages, seen = await page_app(runtime, topic)
    timing = support.format_ms(support.summarize_ms(pages))
    value = f"{len(seen):,} rows in {total:.2f} s ({len(seen) / total:,.0f}/s); a page: {timing}"
    results.add("hot topic paged, app path", value, "all, in order", verdict(seen == subscribers))
    results.print()
    return 0 if all(row[3] == "MEETS" for row in results.rows if row[3]) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.subscriber_plan", description=__doc__)
    parser.add_argument("--subscriptions", type=int, default=1_000_000, help="the shape scales with it")
    sys.exit(asyncio.run(main_async(parser.parse_args().subscriptions)))
