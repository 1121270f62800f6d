"""Every Redis key the council workflow owns, and how long each one lives.

All names start with one prefix (`LLM_COUNCIL_KEY_PREFIX`, default `llmc:`) so an operator
can list, export or delete them with one pattern, and tests can use a private prefix on a
shared Redis without ever flushing it. The broker's own keys (queues, unacked messages) and
the result backend's keys (task results, chord counters) are namespaced separately, see
`worker.config`.

Per verification (`<p>v:<id>:...`):

| key | type | written by | lives |
|---|---|---|---|
| `plan` | string (RunPlan JSON) | runner, at submit | deadline + RECORD_TTL_S |
| `state` | hash (state, counts, stage start times) | runner, tasks | deadline + RECORD_TTL_S |
| `done:<stage>` | set of models whose call finished | tasks | deadline + RECORD_TTL_S |
| `events` | list (wake-ups on every state change) | tasks | deadline + RECORD_TTL_S |
| `finished` | list (wake-up once the payload is stored) | closer | deadline + RECORD_TTL_S |
| `r:<stage>:<model>` | string (stage result JSON), SET NX | stage tasks | deadline + RECORD_TTL_S |
| `lease:<stage>:<model>` | string (holder id), SET NX PX | stage tasks | LEASE_TTL_S, renewed |
| `final` | string (VerifyResponse JSON), SET NX | chairman or watchdog | FINAL_TTL_S |
| `lease:final` | string (holder id) | chairman or watchdog | LEASE_TTL_S, renewed |
| `files` | string (JSON of the stage transcript files) | chairman or watchdog | FINAL_TTL_S |
| `finalized` | count of finalize() runs (audit) | chairman or watchdog | FINAL_TTL_S |

Global: `<p>deadlines` (sorted set: id -> deadline, the watchdog's work list) and
`<p>plans` (hash: id -> plan JSON without the subject text, so the watchdog can close a
verification whose per-verification keys vanished).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Stage records outlive the verify deadline by a day: long enough for any redelivery
#: (the longest visibility timeout is minutes) and for an operator to look at a run.
RECORD_TTL_S = 24 * 3600
#: The final payload stays readable by id for a week (the API keeps it in its database).
FINAL_TTL_S = 7 * 24 * 3600
#: Default in-progress lease: renewed every LEASE_HEARTBEAT_S while the provider call runs,
#: so it only expires when its holder died (or hangs with its heartbeat thread dead).
LEASE_TTL_S = 20.0
LEASE_HEARTBEAT_S = 5.0

#: The pseudo-model under which the final payload's lease is taken.
FINAL = "final"


@dataclass(frozen=True)
class Keys:
    prefix: str = "llmc:"

    def _v(self, vid: str, name: str) -> str:
        return f"{self.prefix}v:{vid}:{name}"

    def verification_pattern(self, vid: str) -> str:
        """A SCAN pattern matching every per-verification key of `vid`."""
        return f"{self.prefix}v:{vid}:*"

    def plan(self, vid: str) -> str:
        return self._v(vid, "plan")

    def state(self, vid: str) -> str:
        return self._v(vid, "state")

    def done(self, vid: str, stage: str) -> str:
        return self._v(vid, f"done:{stage}")

    def events(self, vid: str) -> str:
        return self._v(vid, "events")

    def finished(self, vid: str) -> str:
        return self._v(vid, "finished")

    def result(self, vid: str, stage: str, model: str) -> str:
        return self._v(vid, f"r:{stage}:{model}")

    def lease(self, vid: str, stage: str, model: str) -> str:
        return self._v(vid, f"lease:{stage}:{model}")

    def final(self, vid: str) -> str:
        return self._v(vid, "final")

    def final_lease(self, vid: str) -> str:
        return self._v(vid, f"lease:{FINAL}")

    def files(self, vid: str) -> str:
        return self._v(vid, "files")

    def finalized(self, vid: str) -> str:
        return self._v(vid, "finalized")

    @property
    def deadlines(self) -> str:
        return f"{self.prefix}deadlines"

    @property
    def plans(self) -> str:
        return f"{self.prefix}plans"
