"""A legacy fan-out job reads several pages of its topic before it hands the rest on
(docs/legacy.md#from-envelope-to-push): a large topic costs fewer queue round trips."""

from __future__ import annotations

import time

from app.core.channels import Channel
from app.legacy.fanout import PAGES_PER_JOB, LegacyFanout, channel_chooser
from app.legacy.jobs import LegacyDeliveryJob, LegacyEnvelope, LegacyFanoutJob, legacy_delivery_stream
from app.legacy.models import LegacyInstallation, LegacySubscription
from app.runtime import open_runtime
from tests.support import make_settings
from tests.support.legacy import welcome

PAGE = 3


async def test_a_job_reads_pages_up_to_its_bound_then_hands_the_rest_on(database_url: str) -> None:
    topic = welcome(time.time_ns())  # a topic of this run alone (the database is shared)
    subscribers = PAGE * PAGES_PER_JOB + 2
    ids = [f"installation-{n:03}" for n in range(subscribers)]
    async with open_runtime(make_settings(database_url)) as runtime:
        now = time.time_ns()
        async with runtime.sessions() as session, session.begin():
            session.add_all(LegacyInstallation(id=i, kind=1, token=f"t{i}", registered_ns=now) for i in ids)
            session.add_all(LegacySubscription(topic=topic, installation_id=i, created_ns=now) for i in ids)
        fanout = LegacyFanout(runtime.legacy_rules, PAGE, channel_chooser(apns=True, fcm=True, http=False))
        job = LegacyFanoutJob(LegacyEnvelope(topic, now, b"\x0a\x00", "key"), now)
        pushed = []
        async with runtime.reads() as session:
            first = await fanout.fan_out(session, job)
            assert first.next_job is not None and first.next_job.after == ids[PAGE * PAGES_PER_JOB - 1]
            rest = await fanout.fan_out(session, first.next_job)
            assert rest.next_job is None
        for page in (first, rest):
            assert set(page.deliveries) == {legacy_delivery_stream(Channel.APNS)}
            payloads = page.deliveries[legacy_delivery_stream(Channel.APNS)]
            pushed.append([LegacyDeliveryJob.decode(p).installation_id for p in payloads])
    assert pushed == [ids[: PAGE * PAGES_PER_JOB], ids[PAGE * PAGES_PER_JOB :]]
