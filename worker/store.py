"""The idempotent stage-result store: each (verification, stage, model) is computed once.

`StageStore.run_once(result_key, lease_key, compute)`:

1. If a result is stored under `result_key`, return it.
2. Else take the in-progress lease (`SET lease <holder> NX PX ttl`); a heartbeat thread
   renews it while `compute` runs (the provider call). Then store the result with
   `SET NX` (the first writer wins), release the lease, and return the *stored* value.
3. If another holder has the lease, wait: for the result to appear (return it), for the
   lease to vanish (its holder died: go to 2), or until `wait_until` (store `give_up()`
   with SET NX and return whatever is stored).

A holder id is `<boot id>|<pid namespace>|<pid>|<token>`. A waiter on the same host and in
the same pid namespace whose holder process is gone (a SIGKILLed pool child, a killed
worker restarted on the same machine) takes the lease over at once instead of waiting for
it to expire. Other holders are trusted until their lease expires (LEASE_TTL_S after their
heartbeat stopped).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
#: The stored result ({1, value}); else take the lease ({2}); else who holds it ({3, holder}).
_ACQUIRE = """
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2, ''} end
return {3, redis.call('GET', KEYS[2]) or ''}
"""
#: Store the result if none is stored, release our lease, return the stored value.
_STORE = """
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('DEL', KEYS[2])
end
return redis.call('GET', KEYS[1])
"""


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_BOOT_ID = _read("/proc/sys/kernel/random/boot_id")
_PID_NS = _pid_namespace()


def holder_id() -> str:
    return f"{_BOOT_ID}|{_PID_NS}|{os.getpid()}|{uuid.uuid4().hex}"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    stat = _read(f"/proc/{pid}/stat")
    # A zombie (state Z) has exited and waits for its parent to reap it.
    return bool(stat) and stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def holder_is_dead(holder: str) -> bool:
    """True only when the holder provably ran on this machine, in this pid namespace, and
    its process no longer exists."""
    parts = holder.split("|")
    if len(parts) != 4 or not _BOOT_ID or not _PID_NS:
        return False
    boot, ns, pid, _ = parts
    if boot != _BOOT_ID or ns != _PID_NS or not pid.isdigit():
        return False
    return int(pid) != os.getpid() and _process_gone(int(pid))


def holder_pid(holder: str) -> int | None:
    parts = holder.split("|")
    return int(parts[2]) if len(parts) == 4 and parts[2].isdigit() else None


class Heartbeat:
    """One daemon thread per process that renews every lease this process holds."""

    def __init__(self, client: Any, interval_s: float) -> None:
        self._client = client
        self._interval = interval_s
        self._leases: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._renew = client.register_script(_RENEW)

    def add(self, key: str, token: str, ttl_ms: int) -> None:
        with self._lock:
            self._leases[key] = (token, ttl_ms)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="llmc-lease-heartbeat", daemon=True
                )
                self._thread.start()

    def remove(self, key: str) -> None:
        with self._lock:
            self._leases.pop(key, None)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            with self._lock:
                leases = dict(self._leases)
            for key, (token, ttl_ms) in leases.items():
                try:
                    if not self._renew(keys=[key], args=[token, ttl_ms]):
                        log.warning("lease %s was lost while its call ran", key)
                        self.remove(key)
                except Exception as exc:  # keep renewing the others; the lease may expire
                    log.warning("could not renew lease %s: %s", key, exc)


@dataclass(frozen=True)
class Outcome:
    """What `run_once` returned: the stored value, and whether this caller computed it and
    whether its own value is the one stored."""

    value: str
    computed: bool
    won: bool


class StageStore:
    def __init__(
        self,
        client: Any,
        *,
        lease_ttl_s: float,
        heartbeat_s: float,
        poll_s: float = 0.05,
    ) -> None:
        self.client = client
        self.lease_ttl_ms = max(1, int(lease_ttl_s * 1000))
        self.poll_s = poll_s
        self.heartbeat = Heartbeat(client, heartbeat_s)
        self._acquire = client.register_script(_ACQUIRE)
        self._store = client.register_script(_STORE)
        self._release = client.register_script(_RELEASE)

    def get(self, key: str) -> str | None:
        value = self.client.get(key)
        return value.decode() if isinstance(value, bytes) else value

    def put_if_absent(self, key: str, value: str, ttl_s: int) -> str:
        """SET NX and return the stored value (ours or the earlier one)."""
        pipe = self.client.pipeline()
        pipe.set(key, value, nx=True, ex=max(1, ttl_s))
        pipe.get(key)
        _, stored = pipe.execute()
        return stored.decode() if isinstance(stored, bytes) else stored

    def _try_lease(self, lease_key: str, token: str) -> bool:
        return bool(self.client.set(lease_key, token, nx=True, px=self.lease_ttl_ms))

    def release(self, lease_key: str, token: str) -> None:
        with contextlib.suppress(Exception):
            self._release(keys=[lease_key], args=[token])

    def lease_holder(self, lease_key: str) -> str | None:
        return self.get(lease_key)

    def run_once(
        self,
        result_key: str,
        lease_key: str,
        compute: Callable[[], str],
        *,
        ttl_s: int,
        wait_until: float | None = None,
        give_up: Callable[[], str] | None = None,
        before: Callable[[Any], None] | None = None,
        after: Callable[[Any], None] | None = None,
    ) -> Outcome:
        """`before(pipe)` / `after(pipe)` queue extra commands (state updates) that travel
        in the same round trip as the first lookup / as storing the result."""
        first = True
        while True:
            token = holder_id()
            keys, args = [result_key, lease_key], [token, self.lease_ttl_ms]
            if first and before is not None:
                pipe = self.client.pipeline(transaction=False)
                before(pipe)
                self._acquire(keys=keys, args=args, client=pipe)
                code, found = pipe.execute()[-1]
            else:
                code, found = self._acquire(keys=keys, args=args)
            first = False
            found = found.decode() if isinstance(found, bytes) else found
            if code == 1:
                self._run_after(after)
                return Outcome(found, computed=False, won=False)
            if code == 2:
                return self._compute(result_key, lease_key, token, compute, ttl_s, after)
            if found and holder_is_dead(found):
                log.info("taking over lease %s from dead holder %s", lease_key, found)
                self.release(lease_key, found)
                continue
            if wait_until is not None and time.time() >= wait_until:
                value = (give_up or compute)()
                stored = self.put_if_absent(result_key, value, ttl_s)
                self._run_after(after)
                return Outcome(stored, computed=True, won=stored == value)
            time.sleep(self.poll_s)

    def _run_after(self, after: Callable[[Any], None] | None) -> None:
        if after is not None:
            pipe = self.client.pipeline(transaction=False)
            after(pipe)
            pipe.execute()

    def _compute(
        self,
        result_key: str,
        lease_key: str,
        token: str,
        compute: Callable[[], str],
        ttl_s: int,
        after: Callable[[Any], None] | None = None,
    ) -> Outcome:
        self.heartbeat.add(lease_key, token, self.lease_ttl_ms)
        try:
            value = compute()
        except BaseException:
            self.heartbeat.remove(lease_key)
            self.release(lease_key, token)
            raise
        self.heartbeat.remove(lease_key)
        pipe = self.client.pipeline(transaction=False)
        self._store(keys=[result_key, lease_key], args=[value, max(1, ttl_s), token], client=pipe)
        if after is not None:
            after(pipe)
        raw = pipe.execute()[0]
        stored = raw.decode() if isinstance(raw, bytes) else raw
        return Outcome(stored, computed=True, won=stored == value)
