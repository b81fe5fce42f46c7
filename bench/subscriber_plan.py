"""Benchmark: the fan-out page query's plan and speed over 1,000,000 stored subscriptions.

    python -m bench.subscriber_plan [--subscriptions 1000000] [--hot-subscribers 100000] ...

A fresh PostgreSQL database is created and migrated (Alembic, as the app does), recipients and then
subscriptions are bulk-loaded with COPY (asyncpg copy_records_to_table) in random order (so heap order
says nothing about key order, as in a table filled over time), and the tables are VACUUM ANALYZEd.
Then the exact SQL that `app.recipients.repository.subscribers_query(topic, after, 1000)` compiles to
for the app's driver (postgresql+asyncpg, bound parameters) is run with EXPLAIN (ANALYZE, BUFFERS)
for: the hot topic's first page, a middle page of it reached by keyset (after = the 50,000th
subscriber), and a cold topic. Each plan is checked to read subscriptions through pk_subscriptions
(Index Scan / Index Only Scan, never a Seq Scan), and the hot topic is paged end to end with keyset
pages. The database is dropped at the end.

Shape of the data (defaults): 120,000 recipients. One hot group topic is subscribed by 100,000 of
them (a topic has at most one subscription per recipient, so a 100,000-subscriber topic needs at
least 100,000 recipients). The other 900,000 subscriptions belong to 20,000 "active" recipients, 45
topics each, drawn from 50,000 cold topics (90% group, 10% welcome), about 18 subscribers per topic.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from app.recipients import repository
from app.runtime import open_runtime
from bench._proc import load_average
from bench._results import Results
from bench._results import verdict as meets
from bench._support import (
    DEFAULT_ADMIN_DSN,
    RECIPIENT_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    asyncpg_dsn,
    bench_database,
    environment_line,
    format_ms,
    server_version,
    summarize_ms,
)
from bench.registration import CpuWindow

PK_INDEX = "pk_subscriptions"
CHANNEL_APNS, CHANNEL_FCM, CHANNEL_HTTP = 1, 2, 3


# --------------------------------------------------------------------------- data


@dataclass
class Dataset:
    recipients: list[tuple[Any, ...]]
    subscriptions: list[tuple[Any, ...]]
    hot_topic: bytes
    hot_subscribers_sorted: list[bytes]
    cold_topic: bytes
    cold_topic_subscribers: int
    topics_total: int


def build_dataset(args: argparse.Namespace) -> Dataset:
    rng = random.Random(args.seed)
    now_ns = time.time_ns()
    n_recipients = args.recipients
    if args.hot_subscribers > n_recipients:
        raise SystemExit("--hot-subscribers cannot exceed --recipients (one subscription per recipient)")
    if args.active_recipients > n_recipients:
        raise SystemExit("--active-recipients cannot exceed --recipients")
    rest = args.subscriptions - args.hot_subscribers
    per_active, remainder = divmod(rest, args.active_recipients)
    if per_active + (1 if remainder else 0) > args.topics:
        raise SystemExit("not enough cold topics for the subscriptions asked")

    ids = [rng.randbytes(32) for _ in range(n_recipients)]
    hot_topic = b"\x00" + rng.randbytes(16)
    n_welcome = args.topics // 10
    cold_topics = [b"\x01" + rng.randbytes(32) for _ in range(n_welcome)]
    cold_topics += [b"\x00" + rng.randbytes(16) for _ in range(args.topics - n_welcome)]
    key_pool = [rng.randbytes(126) for _ in range(4096)]  # three 42-byte keys, concatenated

    counts = [0] * n_recipients
    topic_sizes = [0] * len(cold_topics)
    subscriptions: list[tuple[Any, ...]] = []

    def row(topic: bytes, r: int) -> tuple[Any, ...]:
        counts[r] += 1
        start_ns = now_ns - rng.randrange(30 * 86_400 * 10**9)
        if topic[0] == 0x00:
            return (topic, ids[r], start_ns, rng.randrange(1, 5000), rng.choice(key_pool), rng.random() < 0.1)
        return (topic, ids[r], start_ns, None, None, False)

    for r in rng.sample(range(n_recipients), args.hot_subscribers):
        subscriptions.append(row(hot_topic, r))
    for i, r in enumerate(rng.sample(range(n_recipients), args.active_recipients)):
        for t in rng.sample(range(len(cold_topics)), per_active + (1 if i < remainder else 0)):
            topic_sizes[t] += 1
            subscriptions.append(row(cold_topics[t], r))
    rng.shuffle(subscriptions)  # heap order uncorrelated with (topic, recipient_id)

    recipients = []
    for r, recipient_id in enumerate(ids):
        channel = (CHANNEL_APNS, CHANNEL_FCM, CHANNEL_HTTP)[r % 3]
        target = f"https://hooks.example.com/h/{r}" if channel == CHANNEL_HTTP else rng.randbytes(32).hex()
        signing_key = rng.randbytes(32) if channel == CHANNEL_HTTP else None
        recipients.append(
            (recipient_id, rng.randbytes(32), channel, target, signing_key, counts[r], now_ns, now_ns)
        )

    # A typical cold topic: the one whose size is the median.
    order = sorted(range(len(cold_topics)), key=lambda t: topic_sizes[t])
    median = order[len(order) // 2]
    hot_ids = sorted(s[1] for s in subscriptions if s[0] == hot_topic)
    return Dataset(
        recipients=recipients,
        subscriptions=subscriptions,
        hot_topic=hot_topic,
        hot_subscribers_sorted=hot_ids,
        cold_topic=cold_topics[median],
        cold_topic_subscribers=topic_sizes[median],
        topics_total=len(cold_topics) + 1,
    )


def chunks(rows: Sequence[tuple[Any, ...]], size: int) -> Iterator[Sequence[tuple[Any, ...]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


async def load(connection: asyncpg.Connection, data: Dataset) -> None:
    started = time.perf_counter()
    await connection.copy_records_to_table("recipients", records=data.recipients, columns=RECIPIENT_COLUMNS)
    print(f"load: COPY {len(data.recipients):,} recipients in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    for part in chunks(data.subscriptions, 200_000):
        await connection.copy_records_to_table("subscriptions", records=part, columns=SUBSCRIPTION_COLUMNS)
    elapsed = time.perf_counter() - started
    print(
        f"load: COPY {len(data.subscriptions):,} subscriptions in {elapsed:.1f} s "
        f"({len(data.subscriptions) / elapsed:,.0f} rows/s; primary key, recipient index and FK maintained)"
    )
    started = time.perf_counter()
    await connection.execute("VACUUM (ANALYZE) recipients")
    await connection.execute("VACUUM (ANALYZE) subscriptions")
    autovacuum = await connection.fetchval("SHOW autovacuum")
    shared_buffers = await connection.fetchval("SHOW shared_buffers")
    print(
        f"load: VACUUM (ANALYZE) in {time.perf_counter() - started:.1f} s "
        f"(server autovacuum={autovacuum}; the vacuum also sets the visibility map); "
        f"shared_buffers={shared_buffers}"
    )
    sizes = await connection.fetch(
        """SELECT c.relname, pg_relation_size(c.oid) AS bytes, c.reltuples::bigint AS tuples
           FROM pg_class c WHERE c.relname IN
           ('subscriptions', 'pk_subscriptions', 'ix_subscriptions_recipient_id', 'recipients', 'pk_recipients')
           ORDER BY c.relname"""
    )
    print("sizes: " + ", ".join(f"{r['relname']} {r['bytes'] / 2**20:.0f} MiB" for r in sizes))


# --------------------------------------------------------------------------- the query under test


@dataclass
class CompiledQuery:
    sql: str
    param_names: list[str]
    dialect: Any

    def params(self, topic: bytes, after: bytes, limit: int) -> list[Any]:
        """Positional parameters in the compiled statement's order, for these arguments."""
        compiled = repository.subscribers_query(topic, after, limit).compile(dialect=self.dialect)
        assert str(compiled) == self.sql
        return [compiled.params[name] for name in compiled.positiontup or ()]


def compile_query(engine: AsyncEngine, topic: bytes, limit: int) -> CompiledQuery:
    """The SQL the app sends for subscribers_query, compiled by the app's own engine dialect."""
    compiled = repository.subscribers_query(topic, b"", limit).compile(dialect=engine.dialect)
    return CompiledQuery(
        sql=str(compiled), param_names=list(compiled.positiontup or ()), dialect=engine.dialect
    )


def literal_sql(query: CompiledQuery, params: Sequence[Any]) -> str:
    """The SQL with parameters written in as literals, for reading (bytea as '\\x..'::bytea)."""
    sql = query.sql
    for position in range(len(params), 0, -1):
        value = params[position - 1]
        text = f"'\\x{value.hex()}'::bytea" if isinstance(value, bytes) else str(value)
        sql = sql.replace(f"${position}::BYTEA", text).replace(f"${position}::INTEGER", text)
        sql = sql.replace(f"${position}", text)
    return sql


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


@dataclass
class PlanCheck:
    ordered_pk_scan: bool  # every read of subscriptions is an Index Scan / Index Only Scan on the pk
    pk_used: bool  # every read of subscriptions goes through the pk (ordered, or as a bitmap)
    seq_scan: bool  # a Seq Scan anywhere in the plan
    access: str
    rows_read: dict[str, int]  # rows produced by the scan nodes of each relation, all loops
    execution_ms: float
    planning_ms: float
    rows: int
    shared_hit: int
    shared_read: int

    def acceptable(self, need_ordered: bool) -> bool:
        return not self.seq_scan and (self.ordered_pk_scan if need_ordered else self.pk_used)


def check_plan(explained: Any) -> PlanCheck:
    document = json.loads(explained) if isinstance(explained, str) else explained
    top = document[0]
    nodes = list(plan_nodes(top["Plan"]))
    on_subscriptions = [n for n in nodes if n.get("Relation Name") == "subscriptions"]
    ordered = bool(on_subscriptions) and all(
        n["Node Type"] in ("Index Scan", "Index Only Scan") and n.get("Index Name") == PK_INDEX
        for n in on_subscriptions
    )

    def through_pk(node: dict[str, Any]) -> bool:
        if node["Node Type"] in ("Index Scan", "Index Only Scan"):
            return node.get("Index Name") == PK_INDEX
        if node["Node Type"] == "Bitmap Heap Scan":
            children = [c for c in plan_nodes(node) if c["Node Type"] == "Bitmap Index Scan"]
            return bool(children) and all(c.get("Index Name") == PK_INDEX for c in children)
        return False

    def describe(node: dict[str, Any]) -> str:
        if node["Node Type"] == "Bitmap Heap Scan":
            indexes = {c.get("Index Name") for c in plan_nodes(node) if c["Node Type"] == "Bitmap Index Scan"}
            return f"Bitmap Heap Scan over Bitmap Index Scan on {', '.join(sorted(map(str, indexes)))}"
        index = node.get("Index Name")
        return node["Node Type"] + (f" using {index}" if index else "")

    rows_read: dict[str, int] = {}
    for node in nodes:
        relation = node.get("Relation Name")
        if relation and "Scan" in node["Node Type"]:
            rows_read[relation] = rows_read.get(relation, 0) + int(node["Actual Rows"]) * int(
                node["Actual Loops"]
            )
    root = top["Plan"]
    return PlanCheck(
        ordered_pk_scan=ordered,
        pk_used=bool(on_subscriptions) and all(through_pk(n) for n in on_subscriptions),
        seq_scan=any(n["Node Type"] == "Seq Scan" for n in nodes),
        access="; ".join(describe(n) for n in on_subscriptions) or "(subscriptions not scanned)",
        rows_read=rows_read,
        execution_ms=float(top["Execution Time"]),
        planning_ms=float(top["Planning Time"]),
        rows=int(root["Actual Rows"]),
        shared_hit=int(root.get("Shared Hit Blocks", 0)),
        shared_read=int(root.get("Shared Read Blocks", 0)),
    )


def verdict(check: PlanCheck, need_ordered: bool) -> str:
    kind = (
        "Index Scan / Index Only Scan on pk_subscriptions: YES"
        if check.ordered_pk_scan
        else "Index Scan / Index Only Scan on pk_subscriptions: NO"
    )
    seq = "Seq Scan: YES" if check.seq_scan else "Seq Scan: none"
    status = "OK" if check.acceptable(need_ordered) else "FAIL"
    rule = "(required here: ordered pk scan)" if need_ordered else "(required here: pk used, no Seq Scan)"
    return f"{status} {rule}: {kind}; {seq}; subscriptions read by {check.access}"


async def timed_runs(
    connection: asyncpg.Connection, query: CompiledQuery, params: Sequence[Any], repeats: int
) -> list[float]:
    statement = await connection.prepare(query.sql)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await statement.fetch(*params)
        times.append(time.perf_counter() - started)
    return times


async def explain_case(
    connection: asyncpg.Connection,
    query: CompiledQuery,
    title: str,
    topic: bytes,
    after: bytes,
    limit: int,
    repeats: int,
    need_ordered: bool,
    results: Results | None = None,
) -> bool:
    params = query.params(topic, after, limit)
    print()
    print(f"--- {title}")
    print("SQL with these parameters written in:")
    print("    " + literal_sql(query, params).replace("\n", "\n    "))
    text = await connection.fetch("EXPLAIN (ANALYZE, BUFFERS) " + query.sql, *params)
    print("EXPLAIN (ANALYZE, BUFFERS), first run:")
    print("\n".join("    " + r[0] for r in text))
    as_json = await connection.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query.sql, *params)
    check = check_plan(as_json)
    await connection.execute("SET plan_cache_mode = force_generic_plan")
    try:
        generic = check_plan(
            await connection.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query.sql, *params)
        )
    finally:
        await connection.execute("RESET plan_cache_mode")
    runs = await timed_runs(connection, query, params, repeats)
    read = ", ".join(f"{relation} {count:,}" for relation, count in check.rows_read.items())
    print(f"check: {verdict(check, need_ordered)}")
    print(
        f"       {check.rows} rows returned; rows read by scans: {read}; execution {check.execution_ms:.2f} ms "
        f"(planning {check.planning_ms:.2f} ms); buffers hit {check.shared_hit} read {check.shared_read}"
    )
    print(
        f"check (generic plan, as a cached prepared statement may use): {verdict(generic, need_ordered)}; "
        f"execution {generic.execution_ms:.2f} ms"
    )
    print(
        f"timing: {repeats} runs of the prepared query via asyncpg, round trip: {format_ms(summarize_ms(runs))}"
    )
    if results is not None:
        record_case(results, title, check, generic, need_ordered, summarize_ms(runs))
    return check.acceptable(need_ordered) and generic.acceptable(need_ordered)


def record_case(
    results: Results,
    title: str,
    check: PlanCheck,
    generic: PlanCheck,
    need_ordered: bool,
    timing: dict[str, float],
) -> None:
    ok = check.acceptable(need_ordered) and generic.acceptable(need_ordered)
    target = "ordered Index Scan on pk_subscriptions" if need_ordered else "through pk_subscriptions"
    results.add(
        f"plan: {title}",
        f"{check.access} (generic plan: {generic.access})",
        target + ", no Seq Scan",
        meets(ok),
    )
    results.add(
        f"time: {title}",
        f"p50 {timing['p50']:.2f} ms, p99 {timing['p99']:.2f} ms (execution {check.execution_ms:.2f} ms)",
        value=timing["p50"],
        unit="ms",
    )


def record_paging(
    results: Results, path: str, count: int, total: float, pages: Sequence[float], complete: bool
) -> None:
    results.add(
        f"hot topic paged end to end, {path}",
        f"{count:,} rows in {total:.2f} s ({count / total:,.0f} rows/s), {len(pages)} pages, "
        f"page p99 {summarize_ms(pages)['p99']:.2f} ms",
        "complete and in order",
        meets(complete),
        value=total,
        unit="s",
    )


# --------------------------------------------------------------------------- paging end to end


async def page_raw(
    connection: asyncpg.Connection, query: CompiledQuery, data: Dataset, page_size: int
) -> tuple[float, list[float], int, bool]:
    statement = await connection.prepare(query.sql)
    after = b""
    pages: list[float] = []
    seen: list[bytes] = []
    started = time.perf_counter()
    while True:
        t = time.perf_counter()
        rows = await statement.fetch(*query.params(data.hot_topic, after, page_size))
        pages.append(time.perf_counter() - t)
        seen.extend(r[0] for r in rows)
        if len(rows) < page_size:
            break
        after = rows[-1][0]
    total = time.perf_counter() - started
    return total, pages, len(seen), seen == data.hot_subscribers_sorted


async def page_app(
    url: str, data: Dataset, page_size: int, window: CpuWindow
) -> tuple[float, list[float], int, bool]:
    """Through the app: a session (one transaction) per page, as fan-out runs one job per page."""
    settings = Settings(database_url=url)
    async with open_runtime(settings) as runtime:
        async with runtime.sessions() as session:  # warm the pool and the statement cache
            await repository.subscribers_page(session, data.hot_topic, b"", 1)
        await window.start()  # after the warm-up, so the pool's backend is counted
        after = b""
        pages: list[float] = []
        seen: list[bytes] = []
        started = time.perf_counter()
        while True:
            t = time.perf_counter()
            async with runtime.sessions() as session, session.begin():
                rows = await repository.subscribers_page(session, data.hot_topic, after, page_size)
            pages.append(time.perf_counter() - t)
            seen.extend(r.recipient_id for r in rows)
            if len(rows) < page_size:
                break
            after = rows[-1].recipient_id
        total = time.perf_counter() - started
        await window.stop()
    return total, pages, len(seen), seen == data.hot_subscribers_sorted


def host_line(window: CpuWindow) -> str:
    """CPU of this run (this process and its PostgreSQL backends) against everything else on the host."""
    ours = (window.client + window.postgres) / window.wall
    return (
        f"cpu: this process {window.client / window.wall:.2f} + postgres backends "
        f"{window.postgres / window.wall:.2f} CPUs; whole host {window.host_busy:.2f} of {os.cpu_count()}, "
        f"of which unrelated load {max(0.0, window.host_busy - ours):.2f}"
    )


def by_position(pages: Sequence[float]) -> str:
    """Mean page time over each tenth of the walk: flat means a page costs the same anywhere."""
    tenth = max(1, len(pages) // 10)
    means = [
        sum(pages[i : i + tenth]) / len(pages[i : i + tenth]) * 1000 for i in range(0, len(pages), tenth)
    ]
    return "mean ms per page by tenth of the walk: " + " ".join(f"{m:.1f}" for m in means[:10])


# --------------------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> int:
    print(environment_line())
    print(f"load average before start: {load_average()}")
    print(f"postgres: {await server_version(args.admin_dsn)} at {args.admin_dsn.rsplit('@', 1)[-1]}")
    started = time.perf_counter()
    data = build_dataset(args)
    # The dataset (millions of tuples) lives for the whole run: frozen, the collector never rescans it,
    # so a full collection cannot stall the timed app-path paging below.
    gc.collect()
    gc.freeze()
    print(
        f"data: {len(data.recipients):,} recipients, {len(data.subscriptions):,} subscriptions over "
        f"{data.topics_total:,} topics; hot topic {len(data.hot_subscribers_sorted):,} subscribers; "
        f"{args.active_recipients:,} active recipients with "
        f"{(args.subscriptions - args.hot_subscribers) // args.active_recipients} cold topics each; "
        f"cold topic shown: {data.cold_topic_subscribers} subscribers; generated in "
        f"{time.perf_counter() - started:.1f} s (seed {args.seed})"
    )
    results = Results("subscriber_plan", "fan-out page query plan and speed")
    results.add(
        "data",
        f"{len(data.subscriptions):,} subscriptions, hot topic {len(data.hot_subscribers_sorted):,} subscribers",
        value=len(data.subscriptions),
    )
    all_ok = True
    async with bench_database(args.admin_dsn, keep=args.keep_db) as url:
        connection = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await load(connection, data)
            async with open_runtime(Settings(database_url=url)) as runtime:
                query = compile_query(runtime.engine, data.hot_topic, args.page_size)
            print()
            print(
                f"query: subscribers_query(topic, after, {args.page_size}) compiled with the app's engine "
                f"dialect ({runtime.engine.dialect.name}+{runtime.engine.dialect.driver}); "
                f"parameters {query.param_names}:"
            )
            print("    " + query.sql.replace("\n", "\n    "))
            n_hot = len(data.hot_subscribers_sorted)
            middle_after = data.hot_subscribers_sorted[n_hot // 2 - 1]
            cases = [
                ("hot topic, first page (after = b'')", data.hot_topic, b"", True),
                (
                    f"hot topic, middle page by keyset (after = subscriber #{n_hot // 2})",
                    data.hot_topic,
                    middle_after,
                    True,
                ),
                (
                    f"hot topic, last full page by keyset (after = subscriber #{n_hot - args.page_size})",
                    data.hot_topic,
                    data.hot_subscribers_sorted[n_hot - args.page_size - 1],
                    False,
                ),
                (
                    f"cold topic ({data.cold_topic_subscribers} subscribers), first page",
                    data.cold_topic,
                    b"",
                    False,
                ),
            ]
            for title, topic, after, need_ordered in cases:
                ok = await explain_case(
                    connection,
                    query,
                    title,
                    topic,
                    after,
                    args.page_size,
                    args.repeats,
                    need_ordered,
                    results,
                )
                all_ok = all_ok and ok

            print()
            print(f"--- paging the hot topic end to end, keyset pages of {args.page_size}")
            window = CpuWindow(os.getpid(), args.admin_dsn, url.rsplit("/", 1)[1])
            await window.start()
            total, pages, count, ordered = await page_raw(connection, query, data, args.page_size)
            await window.stop()
            print(
                f"raw asyncpg (prepared statement, one connection): {count:,} rows in {len(pages)} pages, "
                f"{total * 1000:.0f} ms total ({count / total:,.0f} rows/s); "
                f"complete and in order: {'yes' if ordered and count == len(data.hot_subscribers_sorted) else 'NO'}"
            )
            print(f"    per page: {format_ms(summarize_ms(pages))}")
            print(f"    {by_position(pages)}")
            print(f"    {host_line(window)}")
            complete = ordered and count == len(data.hot_subscribers_sorted)
            record_paging(results, "raw asyncpg", count, total, pages, complete)
            window = CpuWindow(os.getpid(), args.admin_dsn, url.rsplit("/", 1)[1])
            total, pages, count, ordered_app = await page_app(url, data, args.page_size, window)
            print(
                f"app path (repository.subscribers_page, SQLAlchemy session + transaction per page): "
                f"{count:,} rows in {len(pages)} pages, {total * 1000:.0f} ms total ({count / total:,.0f} rows/s); "
                f"complete and in order: {'yes' if ordered_app and count == len(data.hot_subscribers_sorted) else 'NO'}"
            )
            print(f"    per page: {format_ms(summarize_ms(pages))}")
            print(f"    {by_position(pages)}")
            print(f"    {host_line(window)}")
            complete = ordered_app and count == len(data.hot_subscribers_sorted)
            record_paging(results, "app path", count, total, pages, complete)
            all_ok = all_ok and ordered and ordered_app
        finally:
            await connection.close()
    print()
    print(
        "summary: hot-topic first and middle pages read subscriptions by an ordered Index Scan on "
        "pk_subscriptions, the last page and the cold topic through pk_subscriptions, no Seq Scan anywhere, "
        f"paging complete and in order: {'YES' if all_ok else 'NO'}"
    )
    results.add(
        "all checks",
        "YES" if all_ok else "NO",
        "pk_subscriptions, no Seq Scan, paging complete",
        meets(all_ok),
    )
    results.write(args.json)
    return 0 if all_ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.subscriber_plan", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--admin-dsn", default=DEFAULT_ADMIN_DSN, help="DSN used to create and drop the database"
    )
    parser.add_argument("--subscriptions", type=int, default=1_000_000, help="subscriptions in all")
    parser.add_argument("--recipients", type=int, default=120_000, help="recipients in all")
    parser.add_argument(
        "--active-recipients", type=int, default=20_000, help="recipients holding the cold topics"
    )
    parser.add_argument("--topics", type=int, default=50_000, help="cold topics (besides the hot one)")
    parser.add_argument("--hot-subscribers", type=int, default=100_000, help="subscribers of the hot topic")
    parser.add_argument("--page-size", type=int, default=1000, help="limit passed to subscribers_query")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each query")
    parser.add_argument("--seed", type=int, default=1, help="random seed for the data")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the benchmark database")
    parser.add_argument("--json", metavar="PATH", help="also write the measured numbers as JSON to PATH")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
