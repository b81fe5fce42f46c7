"""The test Redis Cluster: six nodes on loopback (three primaries, a replica each), found through
XMTP_PUSH_TEST_REDIS_CLUSTER; `make redis-cluster` starts it (.ci/run does, on 7001..7006).

A test that needs it and does not find it fails with one line saying how to start it, never skips.
The cluster has one database; a host-wide lock keeps two test runs from flushing each other's keys.
A test may kill a primary with kill -9 (`killable_primary`): the node is started again on the way out,
so the tests after it find all six nodes.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import ClusterNode, RedisCluster

from tests.support import host_lock, took_host_lock

CLUSTER_ENV = "XMTP_PUSH_TEST_REDIS_CLUSTER"
HOW_TO_START = (
    f"{CLUSTER_ENV}: no Redis Cluster for the tests; start one with `make redis-cluster` (ports 7001..7006,"
    f" REDIS_CLUSTER_PORT=N for others) and set {CLUSTER_ENV}=redis://127.0.0.1:7001"
)
LOCK_SECONDS = 300
ROOT = Path(__file__).resolve().parents[2]
CATCH_UP_SECONDS = 5.0
REJOIN_SECONDS = 30.0
HEALTH_POLL_SECONDS = 0.1
SETTLE_SECONDS = 150.0  # the longest a failover may keep the cluster unhealthy in a test


@dataclass(frozen=True)
class ClusterUnderTest:
    url: str
    client: RedisCluster

    def flush(self) -> None:
        """Empty every primary (the replicas follow), as they are now (a test may have failed one over)."""
        self.client.nodes_manager.initialize()
        self.client.flushall(target_nodes=RedisCluster.PRIMARIES)

    def primaries(self) -> int:
        self.client.nodes_manager.initialize()
        return len(self.client.get_primaries())

    def caught_up(self, seconds: float = CATCH_UP_SECONDS) -> None:
        """Return once every primary's writes so far are on its replica. `WAIT 1` on each primary,
        then the replica's own offset read until it reaches the primary's: WAIT only waits for the
        writes of the connection it is sent on, and this one wrote nothing."""
        self.client.nodes_manager.initialize()
        for primary in self.client.get_primaries():
            waited = self.client.execute_command("WAIT", 1, int(seconds * 1000), target_nodes=primary)
            assert waited >= 1, f"no replica of {primary.name} acknowledged within {seconds} s"
            replication = self.client.info("replication", target_nodes=primary)
            offset = int(replication["master_repl_offset"])
            replica = replication["slave0"]
            with redis.Redis(host=replica["ip"], port=int(replica["port"])) as on_replica:
                deadline = time.monotonic() + seconds
                while int(on_replica.info("replication")["slave_repl_offset"]) < offset:
                    assert time.monotonic() < deadline, f"the replica of {primary.name} lags"
                    time.sleep(0.002)

    def primary_of(self, key: str) -> Primary:
        """The primary holding `key` now."""
        self.client.nodes_manager.initialize()
        node = self.client.get_node_from_key(key)
        folder = self.client.config_get("dir", target_nodes=node)["dir"]
        # Every node the cluster knows, failed ones too (CLUSTER SLOTS, the client's view, leaves out a
        # replica that is failed or still syncing).
        known = self.client.execute_command("CLUSTER NODES", target_nodes=node)  # by "host:port"
        ports = tuple(sorted(int(address.rsplit(":", 1)[1]) for address in known))
        return Primary(self, node, folder, ports)


@dataclass
class Primary:
    """A primary of the test cluster, to be killed with kill -9 and started again."""

    cluster: ClusterUnderTest
    node: ClusterNode
    folder: str  # the node's directory: its cluster configuration, which the restart reads
    ports: tuple[int, ...]  # every node's, as `.ci/redis-cluster` takes them
    killed: bool = False

    @property
    def name(self) -> str:
        return str(self.node.name)

    def kill(self) -> None:
        """kill -9 of the node's process, once every replica caught up (so nothing a client was told
        is written can go with it). Synchronous on purpose: a test's event loop sends nothing between
        the catching up and the kill."""
        self.cluster.caught_up()
        pid = int(self.cluster.client.info("server", target_nodes=self.node)["process_id"])
        self.killed = True
        os.kill(pid, signal.SIGKILL)

    async def restart(self) -> None:
        """Start the node again (`.ci/redis-cluster` starts the nodes that do not answer); it rejoins,
        as a replica of the node that took its slots over, and is back in sync before this returns."""
        started = await asyncio.create_subprocess_exec(
            str(ROOT / ".ci" / "redis-cluster"), self.folder, *map(str, self.ports),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, errors = await started.communicate()
        assert started.returncode == 0, errors.decode()
        deadline = time.monotonic() + REJOIN_SECONDS
        with redis.Redis(host=self.node.host, port=self.node.port, socket_timeout=2) as node:
            while not _in_service(node):
                assert time.monotonic() < deadline, f"{self.name} did not rejoin within {REJOIN_SECONDS} s"
                await asyncio.sleep(0.1)
        self.killed = False
        self.cluster.client.nodes_manager.initialize()


def _in_service(node: redis.Redis) -> bool:
    """The node sees a healthy cluster and, if it is a replica, is in sync with its primary."""
    try:
        if node.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
            return False
        replication = node.info("replication")
    except redis.RedisError:
        return False
    return replication["role"] == "master" or (
        replication.get("master_link_status") == "up" and not replication.get("master_sync_in_progress")
    )


@asynccontextmanager
async def killable_primary(cluster: ClusterUnderTest, key: str) -> AsyncIterator[Primary]:
    """The primary holding `key`, for the test to kill (`.kill()`); killed, it is started again on
    the way out, whatever the test did, so later tests find six nodes and a cluster that is ok."""
    primary = cluster.primary_of(key)
    try:
        yield primary
    finally:
        if primary.killed:
            await primary.restart()


class HealthWatch:
    """The cluster's health as its live nodes tell it, polled from a kill on (`start`): healthy when
    every node but the killed one answers `CLUSTER INFO` with `cluster_state:ok` and no longer gives
    the killed node slots in `CLUSTER NODES`. Bounds on what a failover may cost count from the
    cluster being healthy again, not from a fixed time after the kill: a loaded machine can stall the
    nodes into further failovers, which cost a client as much as the first. Each change of what the
    nodes say is kept with its time, for a failure's message."""

    def __init__(self, primary: Primary) -> None:
        self._primary = primary
        self.started = math.inf
        self.last_unhealthy = -math.inf
        self.healthy = True
        self._changes: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HealthWatch:
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def start(self) -> None:
        """From now on (the kill), the cluster is unhealthy until its live nodes say otherwise."""
        self.started = self.last_unhealthy = time.monotonic()
        self.healthy = False
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def healthy_since(self) -> float:
        """When the cluster last turned healthy (-inf before the kill); now while it is not."""
        return self.last_unhealthy if self.healthy else time.monotonic()

    def story(self) -> str:
        return "; ".join(self._changes) or "no change seen"

    async def wait_until(self, predicate: Callable[[], bool], seconds: float, what: str) -> None:
        """Poll until predicate() holds: fail once `seconds` have passed since this call and since
        the cluster turned healthy, or SETTLE_SECONDS after the kill if it never does."""
        called = time.monotonic()
        while not predicate():
            now = time.monotonic()
            assert now < max(called, self.healthy_since()) + seconds, (
                f"timed out after {seconds:.0f} s of a healthy cluster waiting for {what}"
                f" (cluster after the kill: {self.story()})"
            )
            assert now < max(called, self.started) + SETTLE_SECONDS, (
                f"the cluster did not settle within {SETTLE_SECONDS:.0f} s: {self.story()}"
            )
            await asyncio.sleep(0.01)

    async def _watch(self) -> None:
        ports = [port for port in self._primary.ports if port != self._primary.node.port]
        nodes = [
            aioredis.Redis(host="127.0.0.1", port=p, socket_timeout=1, socket_connect_timeout=1)
            for p in ports
        ]
        try:
            while True:
                states = await asyncio.gather(*(_state_of(node, self._primary.name) for node in nodes))
                self._saw(dict(zip(ports, states, strict=True)))
                await asyncio.sleep(HEALTH_POLL_SECONDS)
        finally:
            await asyncio.gather(*(node.aclose() for node in nodes), return_exceptions=True)

    def _saw(self, states: dict[int, str]) -> None:
        now = time.monotonic()
        self.healthy = all(state == "ok" for state in states.values())
        if not self.healthy:
            self.last_unhealthy = now
        said = "ok" if self.healthy else str({port: state for port, state in states.items() if state != "ok"})
        if not self._changes or not self._changes[-1].endswith(said):
            self._changes.append(f"{now - self.started:.1f} s: {said}")


async def _state_of(node: aioredis.Redis, killed: str) -> str:
    """`ok` when the node sees a cluster in service without the killed node holding slots."""
    try:
        info = await node.execute_command("CLUSTER INFO")
        known = await node.execute_command("CLUSTER NODES")
    except redis.RedisError as error:
        return type(error).__name__
    state = str(info.get("cluster_state", "unknown"))
    if state == "ok" and known.get(killed, {}).get("slots"):
        return "killed node holds slots"
    return state


def cluster_url() -> str:
    url = os.environ.get(CLUSTER_ENV)
    if not url:
        pytest.fail(HOW_TO_START, pytrace=False)
    return url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterUnderTest]:
    """The test cluster, held for this session (other runs on this host wait), flushed at both ends."""
    url = cluster_url()
    try:
        client = RedisCluster.from_url(url, socket_connect_timeout=2)
    except Exception as error:
        pytest.fail(f"{HOW_TO_START} ({type(error).__name__} at {url})", pytrace=False)
    descriptor = host_lock(url)
    try:
        deadline = time.monotonic() + LOCK_SECONDS
        while not took_host_lock(descriptor):
            if time.monotonic() > deadline:
                raise AssertionError(f"another test run held the test Redis Cluster for {LOCK_SECONDS} s")
            time.sleep(0.2)
        cluster = ClusterUnderTest(url, client)
        cluster.flush()  # what an earlier run left, if it was stopped before its end
        yield cluster
        cluster.flush()
    finally:
        os.close(descriptor)
        client.close()
