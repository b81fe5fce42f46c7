"""Commits a worker keeps to send again after Redis refused them: the oldest first, within a bound."""

from __future__ import annotations

from app.queue.base import Commit, Unsent


def commit(*ids: str, partition: int = 0) -> Commit:
    return Commit(ack=list(ids), partition=partition)


def test_kept_commits_go_before_newer_ones_and_are_taken_once() -> None:
    unsent = Unsent(limit=10)
    assert not unsent
    unsent.keep([commit("1-0"), commit("2-0", partition=3)])
    assert unsent
    sent = unsent.take([commit("3-0")])
    assert [c.ack for c in sent] == [["1-0"], ["2-0"], ["3-0"]]
    assert not unsent and unsent.take([]) == []


def test_past_the_bound_the_oldest_are_left_to_the_reclaim() -> None:
    unsent = Unsent(limit=3)
    unsent.keep([commit("1-0", "1-1"), commit("2-0"), commit("3-0", "3-1")])
    assert [c.ack for c in unsent.commits] == [["2-0"], ["3-0", "3-1"]]
    unsent.keep([commit("4-0", "4-1", "4-2", "4-3")])  # one commit over the bound: none kept
    assert not unsent
    unsent.keep([commit(), commit("5-0")])  # follow-up work with nothing to acknowledge counts nothing
    assert len(unsent.commits) == 2
