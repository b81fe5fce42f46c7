"""Two `xmtp-push listen` processes on one firehose: each envelope fans out once, and killing one
with SIGKILL mid-run loses nothing while the other runs (docs/scaling.md, Processes).

The fake xmtpd node runs in this process on a real port; the API and the workers run here too, on
PostgreSQL and the Redis test DB or the test Redis Cluster; the two listeners are real subprocesses
of the console script.
Both queue every envelope they read; the fan-out's claim per envelope lets one fan-out through, so
every subscriber receives each (topic, sequence_id) exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from prometheus_client import REGISTRY

from fakes.fake_xmtpd import FakeXmtpd, group_message, group_topic
from fakes.webhook_receiver import Receiver
from tests.support import pipeline as pipeline_support
from tests.support.listeners import stack_env
from tests.support.pipeline import Member, Stack, hints_of, running_pipeline, wait_until

redis_url = pipeline_support.redis_url
redis_stack = pipeline_support.redis_stack

NODE = 100
MEMBERS = 20
TOPICS = 10
# Each response carries an envelope of every topic: each listener adds them to their partitions in
# one step, in one millisecond, so entries of different partitions share ids (the fan-out's claims
# must tell them apart).
STEPS = 30
STEP_SECONDS = 0.2
KILL_AT_STEP = 12


def start_listener(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    script = Path(sys.executable).with_name("xmtp-push")
    with log.open("wb") as out:
        return subprocess.Popen([str(script), "listen"], env=env, stdout=out, stderr=subprocess.STDOUT)


def log_tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def fanned_out() -> float:
    return REGISTRY.get_sample_value("xmtp_push_envelopes_total", {"result": "fanned_out"}) or 0.0


async def test_two_listeners_fan_each_envelope_out_once_and_a_killed_one_loses_nothing(
    redis_stack: Stack, receiver: Receiver, tmp_path: Path
) -> None:
    """On a single Redis and on a Redis Cluster."""
    stack = redis_stack
    assert stack.redis_url is not None
    logs = [tmp_path / "listen-a.log", tmp_path / "listen-b.log"]
    listeners: list[subprocess.Popen[bytes]] = []
    async with FakeXmtpd(keepalive_seconds=0.25) as fake, running_pipeline(stack) as pipe:
        try:
            topics = [group_topic() for _ in range(TOPICS)]
            members: list[tuple[Member, tuple[bytes, ...]]] = []
            for i in range(MEMBERS):
                mine = (topics[i % TOPICS], topics[(i + 1) % TOPICS])
                members.append((await pipe.member(receiver.endpoint(), *mine), mine))
            env = stack_env(stack, xmtpd_address=fake.address, xmtpd_tls="false")
            listeners = [start_listener(env, log) for log in logs]
            await fake.wait_for(lambda: fake.open_streams == 2, 30, "both listeners' streams")
            victim, survivor = listeners
            before = fanned_out()

            published: list[tuple[bytes, int]] = []
            for step in range(STEPS):
                if step == KILL_AT_STEP:
                    os.kill(victim.pid, signal.SIGKILL)
                    await asyncio.to_thread(victim.wait, 10)
                    await fake.wait_for(lambda: fake.open_streams == 1, 10, "the killed stream to close")
                # The node's sequence ids rise across its envelopes, whatever their topics.
                hints = [(topic, step * TOPICS + i + 1) for i, topic in enumerate(topics)]
                sent_to = fake.publish([group_message(NODE, sequence, topic) for topic, sequence in hints])
                assert sent_to == (2 if step < KILL_AT_STEP else 1)
                published += hints
                await asyncio.sleep(STEP_SECONDS)

            expected = {
                member.endpoint.path: Counter(hint for hint in published if hint[0] in mine)
                for member, mine in members
            }

            def arrived() -> bool:
                return all(
                    not (want - hints_of(receiver, member))
                    for (member, _), want in zip(members, expected.values(), strict=True)
                )

            await wait_until(lambda: arrived() or survivor.poll() is not None, 30, "every hint")
            assert survivor.poll() is None, log_tail(logs[1])
            await pipe.settled(receiver)
            for member, _ in members:
                got = hints_of(receiver, member)
                want = expected[member.endpoint.path]
                assert got == want, {"missing": want - got, "extra": got - want}
            assert victim.returncode == -signal.SIGKILL
            # Both listeners queued the envelopes published before the kill; each fanned out once.
            assert fanned_out() - before == STEPS * TOPICS

            survivor.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(survivor.wait, 20) == 0, log_tail(logs[1])
        finally:
            for listener in listeners:
                if listener.poll() is None:
                    listener.kill()
                listener.wait(timeout=10)
