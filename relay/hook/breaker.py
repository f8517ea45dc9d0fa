"""Circuit breaker shared by every hook process of this user, in `<state_dir>/breaker.json`.

Closed: requests go through. After `breaker_failures` consecutive
timeout/unavailable outcomes it opens: prompts skip retrieval (outcome
`circuit_open`) for `breaker_cooldown_s`. Then exactly one process claims the
probe under the lock; its success (any HTTP answer but the server's saying it ran out of
time, a `timeout`) closes the breaker, its failure re-opens it for another cool-down. A
probe whose process died is considered lost after PROBE_LOST_S and the next prompt probes
instead.
The healthy path costs one failed open(): the file exists only while failing.
"""

from __future__ import annotations

import os
import time

from relay.hook import codec
from relay.hook.files import Lock, read_owned_object, write_atomic

FAILURES = ("timeout", "unavailable")
PROBE_LOST_S = 15.0
# A stamp further ahead of the clock than this was made before the clock was set back (NTP
# correcting a clock that ran fast, a VM resumed with its old time): waiting for it kept the
# breaker open, or its probe pending, for as long as the clock went back (QA: 2 hours, with
# a 30 s cool-down). Well beyond one process reading the clock just before another's stamp.
AHEAD_S = 10.0


def _paths(state_dir: str) -> tuple[str, str]:
    return os.path.join(state_dir, "breaker.json"), os.path.join(state_dir, "breaker.lock")


def _read(path: str, url: str) -> dict:
    state = {"url": url, "failures": 0, "opened_at": None, "probe_at": None}
    stored = read_owned_object(path, 4096, "url", url)
    if stored is None:
        return state
    if type(stored.get("failures")) is int:
        state["failures"] = stored["failures"]
    for key in ("opened_at", "probe_at"):
        if isinstance(stored.get(key), int | float) and type(stored[key]) is not bool:
            state[key] = float(stored[key])
    return state


def status(state_dir: str, url: str, cooldown_s: float, now: float | None = None) -> dict:
    """`url`'s breaker as its hooks see it (for `relay stats` and `relay doctor`): `state`
    'closed', 'open' or 'half_open' (cool-down over, probe pending or due), `failures`,
    `opened_at`. State another URL left reads as closed: the hooks ignore it too."""
    now = time.time() if now is None else now
    state = _read(_paths(state_dir)[0], url)
    opened = state["opened_at"]
    phase = (
        "closed" if opened is None else "open" if _within(now, opened, cooldown_s) else "half_open"
    )
    return {"state": phase, "failures": state["failures"], "opened_at": opened}


def admit(state_dir: str, url: str, cooldown_s: float, until: float) -> tuple[bool, bool]:
    """(may this process search, is it the probe)."""
    path, lock_path = _paths(state_dir)
    now = time.time()
    state = _read(path, url)
    if state["opened_at"] is None:
        return True, False
    if _within(now, state["opened_at"], cooldown_s):
        return False, False
    with Lock(lock_path, until) as lock:
        if not lock.held:
            # A state folder this user cannot write keeps no breaker (no probe could be
            # claimed, nor the breaker closed): search, rather than skip every prompt for good.
            return lock.error is not None, False
        state = _read(path, url)
        now = time.time()  # the lock may have been waited for
        if state["opened_at"] is None:
            return True, False
        if _within(now, state["opened_at"], cooldown_s):
            return False, False
        if state["probe_at"] is not None and _within(now, state["probe_at"], PROBE_LOST_S):
            return False, False
        state["probe_at"] = now
        write_atomic(path, codec.dumps(state).encode())
        return True, True


def _within(now: float, since: float, seconds: float) -> bool:
    """Whether `now` is in the `seconds` from `since` (a cool-down, a probe's wait); a `since`
    more than AHEAD_S ahead of `now` is from a clock since set back, and over."""
    return since - AHEAD_S <= now < since + seconds


def record(state_dir: str, url: str, outcome: str, threshold: int, probe: bool) -> None:
    """Count a failure, or close the breaker after any answer from the server."""
    path, lock_path = _paths(state_dir)
    failed = outcome in FAILURES
    if not failed and not os.path.exists(path):
        return
    # The request is over and may have used the whole budget: wait briefly for the lock, no more.
    with Lock(lock_path, time.monotonic() + 0.02) as lock:
        if not lock.held:
            return
        if not failed:
            try:
                os.unlink(path)
            except OSError:
                pass
            return
        state = _read(path, url)
        state["failures"] += 1
        if probe or state["failures"] >= threshold:
            state["opened_at"] = time.time()
            state["probe_at"] = None
        write_atomic(path, codec.dumps(state).encode())
