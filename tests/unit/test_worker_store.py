"""The idempotent stage store and the state hash, against the real Redis (private prefix)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from worker.keys import Keys
from worker.state import StateStore
from worker.store import StageStore, holder_id, holder_is_dead, holder_pid


@pytest.fixture
def client(redis_url: str) -> Iterator[object]:
    import redis

    c = redis.Redis.from_url(redis_url)
    prefix = f"llmc-unit-{uuid.uuid4().hex[:8]}:"
    c.llmc_prefix = prefix  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        doomed = list(c.scan_iter(match=f"{prefix}*"))
        if doomed:
            c.delete(*doomed)
        c.close()


def _store(client, ttl: float = 2.0) -> StageStore:
    return StageStore(client, lease_ttl_s=ttl, heartbeat_s=0.2, poll_s=0.01)


def test_concurrent_duplicates_compute_once_and_agree(client):
    store = _store(client)
    p = client.llmc_prefix
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        time.sleep(0.3)
        return f"value-{len(calls)}"

    results: list[str] = []

    def run() -> None:
        results.append(store.run_once(p + "r", p + "lease", compute, ttl_s=60).value)

    threads = [threading.Thread(target=run) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == ["value-1"] * 5
    assert client.get(p + "lease") is None  # released
    assert client.ttl(p + "r") > 0


def test_a_stored_result_is_returned_without_computing(client):
    store = _store(client)
    p = client.llmc_prefix
    client.set(p + "r", "earlier")
    out = store.run_once(p + "r", p + "lease", lambda: pytest.fail("computed"), ttl_s=60)
    assert (out.value, out.computed, out.won) == ("earlier", False, False)


def test_first_writer_wins(client):
    store = _store(client)
    p = client.llmc_prefix

    def compute() -> str:
        client.set(p + "r", "someone else")  # another holder stored meanwhile
        return "mine"

    out = store.run_once(p + "r", p + "lease", compute, ttl_s=60)
    assert (out.value, out.computed, out.won) == ("someone else", True, False)


def test_the_lease_is_renewed_while_the_call_runs(client):
    store = _store(client, ttl=0.5)
    p = client.llmc_prefix
    seen: list[bytes | None] = []

    def compute() -> str:
        time.sleep(1.2)  # more than twice the lease TTL
        seen.append(client.get(p + "lease"))
        return "done"

    assert store.run_once(p + "r", p + "lease", compute, ttl_s=60).value == "done"
    assert seen[0] is not None


def test_an_exception_releases_the_lease_and_stores_nothing(client):
    store = _store(client)
    p = client.llmc_prefix

    def boom() -> str:
        raise RuntimeError("provider client bug")

    with pytest.raises(RuntimeError):
        store.run_once(p + "r", p + "lease", boom, ttl_s=60)
    assert client.get(p + "lease") is None and client.get(p + "r") is None


def test_a_dead_holder_on_this_machine_is_taken_over_at_once(client):
    store = _store(client, ttl=30)
    p = client.llmc_prefix
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = holder_id().replace(f"|{os.getpid()}|", f"|{child.pid}|")
    assert holder_pid(dead) == child.pid and holder_is_dead(dead)
    client.set(p + "lease", dead, px=30_000)
    t0 = time.time()
    out = store.run_once(p + "r", p + "lease", lambda: "recomputed", ttl_s=60)
    assert out.value == "recomputed" and time.time() - t0 < 1.0


def test_a_live_or_foreign_holder_is_waited_for(client):
    assert not holder_is_dead(holder_id())  # ourselves
    assert not holder_is_dead("other-boot|ns|1|tok")  # another machine
    store = _store(client, ttl=30)
    p = client.llmc_prefix
    client.set(p + "lease", "other-boot|ns|1|tok", px=30_000)
    out = store.run_once(
        p + "r",
        p + "lease",
        lambda: pytest.fail("computed under a live lease"),
        ttl_s=60,
        wait_until=time.time() + 0.3,
        give_up=lambda: "gave up",
    )
    assert (out.value, out.won) == ("gave up", True)


def test_state_moves_forward_only_and_counts_each_model_once(client):
    keys = Keys(client.llmc_prefix)
    state = StateStore(client, keys)
    vid = "v1"
    assert state.read(vid) is None
    client.hset(
        keys.state(vid),
        mapping=state.create_mapping(tier="quick", created_at=1.0, deadline_at=2.0, models=2),
    )
    assert state.read(vid).state == "queued"
    assert state.advance(vid, "stage2", 60)
    assert not state.advance(vid, "stage1", 60)  # a redelivered stage-1 task
    assert state.read(vid).state == "stage2"
    assert state.mark_done(vid, "stage1", "m1", 60)
    assert not state.mark_done(vid, "stage1", "m1", 60)
    state.mark_done(vid, "stage2", None, 60, total=2)
    st = state.read(vid)
    assert (st.stage1.done, st.stage1.total, st.stage2.total) == (1, 2, 2)
    assert client.llen(keys.events(vid)) >= 3


def test_state_that_vanished_is_not_recreated(client):
    keys = Keys(client.llmc_prefix)
    state = StateStore(client, keys)
    assert not state.advance("gone", "stage1", 60)
    assert not state.mark_done("gone", "stage1", "m", 60)
    assert client.exists(keys.state("gone"), keys.done("gone", "stage1")) == 0
