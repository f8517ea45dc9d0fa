"""Per-session state: prompt counter, last search keywords, the conversation ledger, the
last session start.

One JSON file per session under `<state_dir>/sessions/`, replaced atomically and
changed only under that session's flock, so two hooks of one session (a prompt
and a subagent, say) never lose each other's updates. Files are bounded (the
ledger keeps the newest LEDGER_MAX entries) and sessions untouched for
SESSION_TTL_S are removed, at most once an hour.
"""

from __future__ import annotations

import os
import time

from relay.hook import codec
from relay.hook.files import Lock, private_dir, read_owned_object, write_atomic

LEDGER_MAX = 400
KEYWORDS_MAX = 64
STATE_MAX_BYTES = 256 * 1024
SESSION_TTL_S = 7 * 24 * 3600
SESSIONS_MAX = 500
CLEANUP_EVERY_S = 3600
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def fresh(session_id: str) -> dict:
    return {
        "v": 1,
        "session": session_id,
        "count": 0,
        "last_search": 0,
        "keywords": [],
        "ledger": {},
        "told_unauthorized": False,
        "last_prompt_id": None,
        "start": None,
    }


def session_file_stem(state_dir: str, session_id: str) -> str:
    """Path without extension; ids that are not plain file names are hashed."""
    name = session_id
    if not (0 < len(name) <= 100 and set(name) <= _SAFE and not name.startswith(".")):
        from relay.hook.outcome_log import sha256_hex

        name = "h-" + sha256_hex(session_id.encode("utf-8", "surrogatepass"))[:40]
    return os.path.join(state_dir, "sessions", name)


class Session:
    """`with Session(...) as s:` holds the lock; `s.data` is the state, `s.save()` stores it."""

    def __init__(self, state_dir: str, session_id: str, until: float) -> None:
        self.session_id = session_id
        private_dir(os.path.join(state_dir, "sessions"))
        stem = session_file_stem(state_dir, session_id)
        self.path = stem + ".json"
        self.lock = Lock(stem + ".lock", until)
        self.data: dict = {}

    @property
    def held(self) -> bool:
        return self.lock.held

    def __enter__(self) -> Session:
        self.lock.__enter__()
        self.data = _load(self.path, self.session_id) if self.lock.held else {}
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)

    def save(self) -> None:
        if not self.lock.held:
            return
        ledger = self.data["ledger"]
        if len(ledger) > LEDGER_MAX:
            for key in list(ledger)[: len(ledger) - LEDGER_MAX]:
                del ledger[key]
        self.data["keywords"] = self.data["keywords"][:KEYWORDS_MAX]
        self.data["updated"] = int(time.time())
        write_atomic(self.path, codec.dumps(self.data).encode())


def _load(path: str, session_id: str) -> dict:
    """The stored state if it is whole and well-typed, else a fresh one."""
    state = fresh(session_id)
    stored = read_owned_object(path, STATE_MAX_BYTES, "session", session_id)
    if stored is None:
        return state
    for key in ("count", "last_search"):
        if type(stored.get(key)) is int and stored[key] >= 0:
            state[key] = stored[key]
    words = stored.get("keywords")
    if isinstance(words, list) and all(isinstance(w, str) for w in words):
        state["keywords"] = words
    ledger = stored.get("ledger")
    if isinstance(ledger, dict):
        state["ledger"] = {k: v for k, v in ledger.items() if type(v) is int}
    state["told_unauthorized"] = stored.get("told_unauthorized") is True
    if isinstance(stored.get("last_prompt_id"), str):
        state["last_prompt_id"] = stored["last_prompt_id"]
    start = stored.get("start")
    if (
        isinstance(start, dict)
        and isinstance(start.get("source"), str)
        and type(start.get("at")) in (int, float)
        and type(start.get("count")) is int
    ):
        state["start"] = {key: start[key] for key in ("source", "at", "count")}
    return state


def cleanup(state_dir: str, now: float | None = None) -> int:
    """Remove stale session files, at most once per CLEANUP_EVERY_S; return how many went."""
    now = time.time() if now is None else now
    sessions = os.path.join(state_dir, "sessions")
    stamp = os.path.join(sessions, ".cleaned")
    try:
        if os.stat(stamp).st_mtime > now - CLEANUP_EVERY_S:
            return 0
    except OSError:
        pass
    try:
        write_atomic(stamp, b"")
        entries = [(e.stat().st_mtime, e.path) for e in os.scandir(sessions) if e.is_file()]
    except OSError:
        return 0
    entries = [(m, p) for m, p in entries if p != stamp]
    entries.sort()
    stale = [p for m, p in entries if m < now - SESSION_TTL_S]
    keep = [p for m, p in entries if m >= now - SESSION_TTL_S and p.endswith(".json")]
    if len(keep) > SESSIONS_MAX:
        for path in keep[: len(keep) - SESSIONS_MAX]:
            stale.append(path)
            stale.append(path[: -len(".json")] + ".lock")
    removed = 0
    for path in stale:
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed
