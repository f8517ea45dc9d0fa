"""Per-session state: prompt counter, last search keywords, the conversation ledger, the
last prompt counted and the last session start.

One JSON file per session under `<state_dir>/sessions/`, read and written in place only
under that session's flock, so two hooks of one session (a prompt
and a subagent, say) never lose each other's updates. Files are bounded (the
ledger keeps the newest LEDGER_MAX entries) and sessions untouched for
SESSION_TTL_S are removed, at most once an hour, by a sweep that stops after
CLEANUP_BUDGET_S and goes on from there a little later. A session's lock file is
removed only by a process holding it (see files.Lock).
"""

from __future__ import annotations

import os
import time

from relay.hook import codec
from relay.hook.files import (
    Lock,
    private_dir,
    read_bytes,
    read_owned_object,
    rewrite_locked,
    write_atomic,
)

LEDGER_MAX = 400  # passages remembered, a whole revision counting as one
KEYWORDS_MAX = 64
SHOWN_ENTRY_MAX = 64 * 1024  # one memory's "passage:hash" pairs, space-separated
STATE_MAX_BYTES = 256 * 1024
SESSION_TTL_S = 7 * 24 * 3600
SESSIONS_MAX = 500
CLEANUP_EVERY_S = 3600
# The sweep runs in a hook process the agent waits for (QA: 20,000 stale files made one hit
# take 644 ms), so it stops after this long: a thousand sessions looked at, or a hundred
# removed (a stat about 7 us, a removal under the session's lock about 80 us).
CLEANUP_BUDGET_S = 0.010
CLEANUP_RETRY_S = 60  # a sweep cut short goes on this much later
STAMP_MAX_BYTES = 300 * (SESSIONS_MAX + 1)  # where a pass cut short goes on, what it kept
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def fresh(session_id: str) -> dict:
    return {
        "v": 1,
        "session": session_id,
        "count": 0,
        "last_search": 0,  # the prompt whose search started the throttle (gate.skip_reason)
        "keywords": [],
        "ledger": {},
        "shown": {},  # per memory, short hashes of the latest texts shown (pack.shown_find)
        "told_unauthorized": False,
        "last_prompt_id": None,
        "last_prompt": None,  # {"sha", "at", "count"} of the last prompt counted
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
    """`with Session(...) as s:` holds the lock; `s.data` is the state, `s.save()` stores it.

    A state folder this user cannot write (`~/.relay/state` left root-owned by `sudo claude`,
    or a file in its place) is not a busy session: the prompt is handled on a scratch state,
    as without a session id, and `error` says why (the run logs it), rather than recall
    going quiet for every session with nothing said."""

    def __init__(self, state_dir: str, session_id: str, until: float, on_error=None) -> None:
        self.session_id = session_id
        self.error: OSError | None = None
        self.on_error = on_error  # called with the OSError when the state cannot be kept
        try:
            private_dir(os.path.join(state_dir, "sessions"))
        except OSError as exc:
            self.error = exc
        stem = session_file_stem(state_dir, session_id)
        self.path = stem + ".json"
        self.lock = Lock(stem + ".lock", until)
        self.data: dict = {}

    @property
    def held(self) -> bool:
        return self.lock.held or self.error is not None

    def __enter__(self) -> Session:
        if self.error is None:
            self.lock.__enter__()
            self.error = self.lock.error
        if self.error is not None:
            self.data = fresh(self.session_id)
            if self.on_error is not None:
                self.on_error(self.error)
        else:
            self.data = _load(self.path, self.session_id) if self.lock.held else {}
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)

    def save(self) -> None:
        if not self.lock.held:
            return
        # At most LEDGER_MAX passages (a whole revision counts as one), the oldest dropped.
        _trim(self.data["ledger"], lambda entry: 1 if type(entry) is int else max(1, len(entry[1])))
        _trim(self.data["shown"], lambda entry: entry.count(" ") + 1)  # passages' hashes
        self.data["keywords"] = self.data["keywords"][:KEYWORDS_MAX]
        self.data["updated"] = int(time.time())
        try:
            rewrite_locked(self.path, codec.dumps(self.data).encode())
        except OSError as exc:  # a full disk, say: this prompt is answered all the same
            self.error = exc
            if self.on_error is not None:
                self.on_error(exc)


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
        state["ledger"] = {k: v for k, v in ledger.items() if _ledger_entry(v)}
    # Absent from a file written before texts were hashed. A list (a hook kept the hash of
    # every text shown for a while) says not which text is a memory's latest: dropped.
    shown = stored.get("shown")
    if isinstance(shown, dict):
        state["shown"] = {k: v for k, v in shown.items() if _shown_entry(v)}
    state["told_unauthorized"] = stored.get("told_unauthorized") is True
    if isinstance(stored.get("last_prompt_id"), str):
        state["last_prompt_id"] = stored["last_prompt_id"]
    for name, key in (("last_prompt", "sha"), ("start", "source")):
        mark = _repeat_mark(stored.get(name), key)
        if mark is not None:
            state[name] = mark
    return state


def _repeat_mark(value: object, key: str) -> dict | None:
    """A stored mark the repeat checks compare with (the last prompt's hash, the last
    start's source: `key`, with its time and prompt count), or None if malformed."""
    if (
        isinstance(value, dict)
        and isinstance(value.get(key), str)
        and type(value.get("at")) in (int, float)
        and type(value.get("count")) is int
    ):
        return {k: value[k] for k in (key, "at", "count")}
    return None


def _trim(mapping: dict, size) -> None:
    """Drop the oldest entries of `mapping` until the sizes of the rest sum to LEDGER_MAX."""
    held = sum(size(entry) for entry in mapping.values())
    for key in list(mapping):
        if held <= LEDGER_MAX:
            break
        held -= size(mapping.pop(key))


def _shown_entry(value: object) -> bool:
    """A well-formed `shown` entry (relay.hook.pack.shown_find): a text's hash, or
    "passage:hash ... #:count ~:hash ..." (read leniently there, so only its type and size
    are checked)."""
    return type(value) is str and 0 < len(value) <= SHOWN_ENTRY_MAX


def _ledger_entry(value: object) -> bool:
    """A well-formed ledger entry (relay.hook.pack): a revision (a file written before
    passages were told apart holds only these), or [revision, [passage, ...]]."""
    if type(value) is int:
        return value >= 1
    return (
        type(value) is list
        and len(value) == 2
        and type(value[0]) is int
        and value[0] >= 1
        and type(value[1]) is list
        and len(value[1]) > 0
        and all(type(seq) is int and seq >= 0 for seq in value[1])
    )


def cleanup(state_dir: str, until: float | None = None, now: float | None = None) -> int:
    """Remove stale sessions, at most once per CLEANUP_EVERY_S, working no later than `until`
    (time.monotonic(); default CLEANUP_BUDGET_S from now); return how many sessions (or
    stray files) went. A sweep cut short is taken up CLEANUP_RETRY_S later where it ended."""
    now = time.time() if now is None else now
    until = time.monotonic() + CLEANUP_BUDGET_S if until is None else until
    sessions = os.path.join(state_dir, "sessions")
    stamp = os.path.join(sessions, ".cleaned")
    try:
        # A stamp ahead of the clock is from before the clock was set back: waited for, it
        # held off every sweep for as long as the clock went back (a day set back, a day).
        if now - CLEANUP_EVERY_S < os.stat(stamp).st_mtime <= now + CLEANUP_RETRY_S:
            return 0
    except OSError:
        pass
    if time.monotonic() >= until:
        return 0
    resume, newest = _pass_so_far(read_bytes(stamp, STAMP_MAX_BYTES) or b"")
    try:
        write_atomic(stamp, b"")  # one sweep at a time
    except OSError:
        return 0
    sweep = _Sweep(now, until, newest)
    try:
        sweep.run(sessions, resume)
    except OSError:
        pass
    try:
        if sweep.reached is None:
            os.utime(stamp, (now, now))
        else:
            kept = "".join(f"\n{age!r} {name}" for age, name in sweep.newest)
            write_atomic(stamp, f"{sweep.reached}{kept}".encode("utf-8", "surrogateescape"))
            due = now - CLEANUP_EVERY_S + CLEANUP_RETRY_S
            os.utime(stamp, (due, due))
    except OSError:
        pass
    return sweep.removed


def _pass_so_far(held: bytes) -> tuple[int, list[tuple[float, str]]]:
    """What the stamp says of a pass cut short: the entry to take it up at, then a line for
    each of the newest sessions it kept so far, "age name" (a stamp from before they were
    kept holds the entry alone)."""
    head, *lines = held.decode("utf-8", "surrogateescape").split("\n")
    if not head.isdigit() or not int(head):
        return 0, []
    newest = []
    for line in lines[:SESSIONS_MAX]:
        age, _, name = line.partition(" ")
        try:
            newest.append((float(age), name))
        except ValueError:
            continue
    return int(head), newest


class _Sweep:
    """One pass over `sessions/` from entry `resume` on (directory order, which removals do not
    change), until the time is up. A session's age is its state file's: its lock file is
    created once and never written, so its own time says nothing.

    Of the sessions within SESSION_TTL_S, those beyond the newest SESSIONS_MAX that the pass
    has seen, in this sweep and the ones before it, go as soon as they are: a session with
    that many newer ones in a part of the folder has at least as many in all of it, so a
    pass of many sweeps removes only what a whole one would. Judged by each sweep's own part,
    a folder of which one sweep could not see 500 sessions in its time never lost one (QA: an
    agent run headless 2,880 times a day left 66,000 files after 12 days, and the pass, never
    done, stalled where skipping the entries it had passed took all of a sweep's time)."""

    def __init__(
        self, now: float, until: float, newest: list[tuple[float, str]] | None = None
    ) -> None:
        self.cutoff = now - SESSION_TTL_S
        self.until = until
        self.removed = 0
        self.reached: int | None = 0  # where to take up a sweep cut short; None when done
        # (age, file name without extension) of the newest SESSIONS_MAX sessions the pass kept
        # so far, a min-heap
        self.newest = newest or []

    def run(self, sessions: str, resume: int) -> None:
        import heapq  # a sweep is due at most once a minute: not every prompt's import

        heapq.heapify(self.newest)
        seen: set[str] = set()
        early: set[str] = set()  # lock files passed before their session's state file
        gone = 0  # entries passed that are removed now, so the rest moved up
        before = 0  # entries before `resume` removed now (sessions kept by earlier sweeps)
        removed: set[str] = set()
        with os.scandir(sessions) as entries:
            for n, entry in enumerate(entries):
                if time.monotonic() >= self.until:
                    self.reached = max(resume, n - gone) - before
                    break
                if n < resume:
                    continue
                stem, ext = os.path.splitext(entry.path)
                if ext not in (".json", ".lock"):  # an orphaned temporary file, say
                    age = _mtime(entry.path)
                    if entry.name != ".cleaned" and age is not None and age < self.cutoff:
                        went = _unlink(entry.path)
                        gone += went
                        self.removed += went
                elif stem in seen:
                    gone += stem in removed
                else:
                    age = _mtime(stem + ".json")
                    if ext == ".lock" and age is not None and age >= self.cutoff:
                        # Judged at its state file: once a pass, even one of many sweeps.
                        early.add(stem)
                        continue
                    seen.add(stem)
                    age = _mtime(stem + ".lock") if age is None else age  # as _age()
                    if age is None:
                        continue
                    if age >= self.cutoff and len(self.newest) < SESSIONS_MAX:
                        heapq.heappush(self.newest, (age, os.path.basename(stem)))
                        continue
                    if age >= self.cutoff and (age, os.path.basename(stem)) > self.newest[0]:
                        # It is among the newest; the oldest of them is not any more.
                        age, name = heapq.heapreplace(self.newest, (age, os.path.basename(stem)))
                        stem = os.path.join(sessions, name)
                        if stem not in seen:  # judged by an earlier sweep: before `resume`
                            if _remove_session(stem, age):
                                self.removed += 1
                                before += 1  # its state file (its lock may be there too)
                                gone += stem in early
                            continue
                    if _remove_session(stem, age):
                        removed.add(stem)
                        gone += 1 + (stem in early)
                        self.removed += 1
            else:
                self.reached = None


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return None


def _age(stem: str) -> float | None:
    """When the session's state was last written; for a lock without state, its creation."""
    age = _mtime(stem + ".json")
    return _mtime(stem + ".lock") if age is None else age


def _unlink(path: str) -> int:
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0


def _remove_session(stem: str, age: float) -> bool:
    """Remove a session's state and lock file while holding its lock, unless it is in use
    (one try) or was written since it was judged at `age`."""
    with Lock(stem + ".lock", time.monotonic()) as lock:
        if not lock.held or _age(stem) != age:
            return False
        _unlink(stem + ".json")
        _unlink(stem + ".lock")  # a process waiting on it finds it gone and takes the new one
        return True
