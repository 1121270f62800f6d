"""Verification state in Redis: queued -> stage1 -> stage2 -> chairman -> done.

The state hash is created by the runner when it submits a verification. Tasks only ever
move it forward (a redelivered stage-1 task cannot move a verification back from stage 2)
and count finished calls in per-stage sets (a model counts once, however often its task
ran). Every change also pushes a wake-up onto the verification's `events` list, so a
waiting runner reacts at once instead of polling. Tasks never recreate a state hash that
has vanished: a lost workflow stays visibly lost, for the watchdog to close.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from shared.response import VerifyResponse
from shared.state import StageProgress, StateName, VerificationState
from worker.keys import Keys

RANKS: dict[str, int] = {"queued": 0, "stage1": 1, "stage2": 2, "chairman": 3, "done": 4}
STAGES = ("stage1", "stage2", "chairman")

#: Move forward only; record when each state was first entered; wake the runner.
_ADVANCE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local rank = tonumber(redis.call('HGET', KEYS[1], 'rank') or '0')
if tonumber(ARGV[2]) <= rank then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'rank', ARGV[2], 'updated_at', ARGV[3])
redis.call('HSETNX', KEYS[1], 't_' .. ARGV[1], ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
"""
#: Count a finished call once per model; set the stage's total if given.
_DONE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local added = 0
if ARGV[1] ~= '' then
  added = redis.call('SADD', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], ARGV[2] .. '_total', ARGV[3]) end
if added == 1 or ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'updated_at', ARGV[4])
  redis.call('RPUSH', KEYS[3], ARGV[2])
  redis.call('EXPIRE', KEYS[3], ARGV[5])
end
return added
"""


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StateStore:
    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._advance = client.register_script(_ADVANCE)
        self._done = client.register_script(_DONE)

    # --- writes ------------------------------------------------------------------------
    def create_mapping(
        self, *, tier: str, created_at: float, deadline_at: float, models: int
    ) -> dict[str, str]:
        now = time.time()
        return {
            "state": "queued",
            "rank": "0",
            "tier": tier,
            "created_at": repr(created_at),
            "deadline_at": repr(deadline_at),
            "updated_at": repr(now),
            "t_queued": repr(now),
            "stage1_total": str(models),
            "stage2_total": "0",
            "chairman_total": "1",
        }

    def advance(self, vid: str, state: StateName, ttl_s: int, *, pipe: Any = None) -> bool:
        """Move forward to `state`; with `pipe`, only queue the command on that pipeline."""
        result = self._advance(
            keys=[self.keys.state(vid), self.keys.events(vid)],
            args=[state, RANKS[state], repr(time.time()), max(1, ttl_s)],
            client=pipe,
        )
        return bool(result) if pipe is None else False

    def mark_done(
        self,
        vid: str,
        stage: str,
        model: str | None,
        ttl_s: int,
        *,
        total: int | None = None,
        pipe: Any = None,
    ) -> bool:
        """Count `model`'s finished call once; with `pipe`, only queue the command."""
        result = self._done(
            keys=[self.keys.state(vid), self.keys.done(vid, stage), self.keys.events(vid)],
            args=[
                model or "",
                stage,
                "" if total is None else str(total),
                repr(time.time()),
                max(1, ttl_s),
            ],
            client=pipe,
        )
        return bool(result) if pipe is None else False

    # --- reads -------------------------------------------------------------------------
    def raw(self, vid: str) -> dict[str, str]:
        return {_s(k): _s(v) for k, v in self.client.hgetall(self.keys.state(vid)).items()}

    def read(self, vid: str) -> VerificationState | None:
        pipe = self.client.pipeline()
        pipe.hgetall(self.keys.state(vid))
        for stage in STAGES:
            pipe.scard(self.keys.done(vid, stage))
        pipe.get(self.keys.final(vid))
        raw, s1, s2, ch, final = pipe.execute()
        fields = {_s(k): _s(v) for k, v in raw.items()}
        payload = VerifyResponse.model_validate_json(final) if final else None
        return build_state(vid, fields, (s1, s2, ch), payload)


def build_state(
    vid: str,
    fields: Mapping[str, str],
    done: tuple[int, int, int],
    payload: VerifyResponse | None,
) -> VerificationState | None:
    if not fields and payload is None:
        return None
    if not fields and payload is not None:
        return VerificationState(
            verification_id=vid,
            state="done",
            tier=payload.tier.value,
            created_at=0.0,
            deadline_at=0.0,
            updated_at=time.time(),
            payload=payload,
        )
    state = "done" if payload is not None else fields.get("state", "queued")
    progress = {}
    for stage, count in zip(STAGES, done, strict=True):
        total = int(fields.get(f"{stage}_total", "0") or 0)
        progress[stage] = StageProgress(done=min(int(count), total) if total else 0, total=total)
    return VerificationState(
        verification_id=vid,
        state=state,
        tier=fields.get("tier", ""),
        created_at=float(fields.get("created_at", "0")),
        deadline_at=float(fields.get("deadline_at", "0")),
        updated_at=float(fields.get("updated_at", "0")),
        stage1=progress["stage1"],
        stage2=progress["stage2"],
        chairman=progress["chairman"],
        payload=payload,
    )
