"""Benchmark (not a test): the delivery pipeline end to end, ingest -> fan-out -> webhook receipt.

    python -m bench.pipeline --mode {memory,redis} [--workers N] [--scenario S] ...

Scenarios (`--scenario`):
- `throughput` (default): M HTTP recipients (`--subscribers`) spread round-robin over T topics
  (`--topics`), registered and subscribed over real gRPC; N envelopes (`--envelopes`) ingested over
  `POST /v1/envelopes` in batches, round-robin over the topics, either as fast as possible
  (`--rate 0`, closed loop with `--ingest-concurrency` requests in flight) or open loop at `--rate`
  hints/s. In the same run, before the backend starts, a "bare loop" (aiohttp, one shared
  ClientSession/TCPConnector, `--bare-concurrency` posts in flight, Standard Webhooks signing by one
  `hmac.digest` call, checked against the standardwebhooks library, and the backend's garbage-collector
  settings) posts the very same bodies to the same receiver: the ceiling for this machine. Prints
  ours/bare.
- `fanout`: one envelope to a topic with `--subscribers` (default 100,000) HTTP subscribers,
  bulk-inserted with COPY. Measures the time from the ingest request until every delivery job is
  on `xmtp-push:deliveries.http` (redis mode: the stream's `entries-added` counter from XINFO
  STREAM, polled every 2 ms: it counts XADDs, so it is not fooled by workers consuming and deleting
  entries meanwhile), and until the receiver has all of them.
- `latency`: open loop at `--rate` hints/s (default 1,000) for `--duration` s (default 30);
  p50/p99 ingest-to-receipt, overall and per window.
- `soak`: `latency` for longer (`--duration 600 --rate 1000`), sampling VmRSS of the backend
  processes every `--rss-every` s (default 10) and printing min/max.

Every run creates a fresh migrated PostgreSQL database (`--db sqlite` puts memory mode on a SQLite
file instead), uses Redis DB `--redis-db` (FLUSHDB first; redis mode only), starts the receiver
(`bench.receiver`) in its own process and the backend as subprocesses: memory mode one `xmtp-push
dev`, redis mode one `xmtp-push api` and `--workers` `xmtp-push worker` processes.

Ingest-to-receipt latency = arrival time at the receiver minus the moment the bench sent the
ingest request carrying that envelope (both CLOCK_MONOTONIC, system-wide on Linux).

`--json PATH` also writes the summary table as JSON (bench/_results.py), with, for throughput,
latency and soak runs, deliveries/s and p50/p99 latency per window of arrival since the first ingest
request (`python -m bench` reads these for its report).
"""

from bench.pipeline.accounting import CpuWindow
from bench.pipeline.ingest import IngestLog, Ingestor
from bench.pipeline.processes import INGEST_TOKEN, Backend, backend_env, running_backend, running_receiver
from bench.pipeline.receiver_client import ReceiverClient

__all__ = [
    "INGEST_TOKEN",
    "Backend",
    "CpuWindow",
    "IngestLog",
    "Ingestor",
    "ReceiverClient",
    "backend_env",
    "running_backend",
    "running_receiver",
]
