"""The two hook flows: a prompt (UserPromptSubmit) and a session start (SessionStart).

prompt:  config -> stdin -> gate (under the session lock) -> breaker -> one
         request -> validate -> drop what the ledger holds -> pack -> ledger
         (under the lock again) -> stdout -> outcome log.
The session lock is not held across the request, so a second hook of the
same session never waits for the network; the ledger is re-read and updated
atomically after the answer, so two concurrent hooks never inject one record twice.
"""

from __future__ import annotations

import os
import time

from relay.hook import breaker, codec, config, gate, state
from relay.hook.client import HookFailure, parse_url, request
from relay.hook.outcome_log import append, fallback_dir, key_label, sha256_hex, timestamp
from relay.hook.pack import (
    PROFILE_INTRO,
    PROMPT_INTRO,
    PROMPT_REMINDER,
    context_room,
    ledger_add,
    pack,
    starved,
    tokens,
    validate,
)

STDIN_MAX = 4 * 1024 * 1024
RESPONSE_MAX = 256 * 1024
QUERY_MAX_CHARS = 2000
EXTRA_CANDIDATES = 3  # asked for beyond max_records, to survive ledger dedupe
SERVER_MAX_K = 12  # the most results one search returns (relay.search.MAX_K: not importable here)
EXIT_RESERVE_S = 0.025  # kept back from the network: breaker, log and exit, slower under load
SOURCES = ("startup", "resume", "clear", "compact")
# Two runs of one session start, or of one prompt, begin together, or the second right after
# the first ended (an agent running its hooks in turn): within the deadline and this much more.
REPEAT_SLACK_S = 1.0


def results_wanted(max_records: int) -> int:
    """How many results to ask the server for: a few beyond `max_records`, so that some
    still remain after the ledger drops what this conversation has seen, but never more
    than one search returns (asking for more is a 422, and no recall at all)."""
    return min(max_records + EXTRA_CANDIDATES, SERVER_MAX_K)


UNAUTHORIZED_MESSAGE = (
    "Relay memory: the server rejected this machine's API key (HTTP {status}); recall is off "
    "until it is fixed. Run `relay doctor` for details."
)


def process_start(fallback: float) -> float:
    """Process start on the time.monotonic() clock, from /proc; `fallback` when unknown.

    /proc counts in clock ticks (10 ms), so this errs early, never late: the
    budget shrinks by up to one tick rather than overrunning. The age is taken
    against a monotonic reading made beside it: subtracting it from a reading
    made earlier (the hook's import) moved the start back by the time between
    the two, which every prompt lost from its deadline and added to its logged time.
    """
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        start_ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        for _ in range(3):  # a reading pair split by a preemption is taken again
            now = time.monotonic()
            boot = time.clock_gettime(time.CLOCK_BOOTTIME)
            if time.monotonic() - now < 0.001:
                break
        elapsed = boot - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return fallback
    return now - elapsed if 0.0 <= elapsed < 1.0 else fallback


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _read_stdin(until: float) -> tuple[bytes | None, str | None]:
    """(all of stdin, None), or (None, why): `stdin_too_large`, `stdin_timeout` (not closed
    in time), or `no_budget_left` when the time was up before reading began: the process
    started late (a loaded machine), which says nothing about the agent's stdin."""
    import select

    if time.monotonic() >= until:
        return None, "no_budget_left"
    chunks: list[bytes] = []
    size = 0
    while True:
        left = until - time.monotonic()
        if left <= 0 or not select.select([0], [], [], left)[0]:
            return None, "stdin_timeout"
        chunk = os.read(0, 1 << 20)
        if not chunk:
            return b"".join(chunks), None
        size += len(chunk)
        if size > STDIN_MAX:
            return None, "stdin_too_large"
        chunks.append(chunk)


def claim_stdio() -> bool:
    """Occupy any of fds 0-2 that is closed with /dev/null, so no file the hook opens takes
    its number: with stdout closed (`relay-hook >&-`) the session lock became fd 1 and the
    hook's answer went into it. Return whether stdout was closed: the answer has nowhere to go."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    for fd in closed:  # ascending, so each open takes the lowest free number: this one
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
            break  # nothing to hold it with; a closed stdout still ends the run unanswered
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    return 1 in closed


def _emit(inv: Invocation, obj: dict) -> str | None:
    """Print the hook's one JSON object: None once it went out, else why not: `late` (the
    deadline passed, and late output is dropped), `stdout_closed` (closed when the process
    started), `stdout_broken_pipe` (the reader went away), `stdout_unwritable`."""
    if inv.stdout_closed:
        return "stdout_closed"
    if time.monotonic() > inv.until:
        return "late"
    view = memoryview(codec.dumps(obj).encode())
    try:
        while view:
            view = view[os.write(1, view) :]
    except BrokenPipeError:
        return "stdout_broken_pipe"
    except OSError:
        return "stdout_unwritable"
    return None


class Invocation:
    """What one hook process knows and will log about itself."""

    def __init__(
        self, argv: list[str], t_main: float, environ, stdout_closed: bool = False
    ) -> None:
        self.environ = environ
        self.stdout_closed = stdout_closed
        self.start = process_start(t_main)
        self.event = "session_start" if argv[1:2] == ["session-start"] else "prompt"
        self.cfg = config.load(environ)
        self.until = self.start + self.cfg.deadline_ms / 1000
        self.ms: dict = {"start": _ms(t_main - self.start)}
        self.log: dict = {"event": self.event, "outcome": "skipped"}

    def finish(self, outcome: str, reason: str | None = None) -> None:
        self.log["outcome"] = outcome
        if reason:
            self.log["reason"] = reason

    def state_failed(self, exc: OSError) -> None:
        """The session's state could not be kept (the run goes on without it): say why."""
        self.log["state_error"] = exc.strerror or type(exc).__name__

    def write_log(self) -> None:
        self.ms["total"] = _ms(time.monotonic() - self.start)
        entry = {"ts": timestamp(), **self.log, "ms": self.ms}
        from relay.hook.files import own_dir, private_dir

        cfg = self.cfg
        try:
            append(private_dir(cfg.state_dir), entry, cfg.log_max_bytes, cfg.log_keep)
            return
        except OSError as exc:
            entry.setdefault("state_error", exc.strerror or type(exc).__name__)
        # The state folder cannot be written: log where `relay stats` and `relay doctor` look
        # next, naming the folder, rather than nowhere.
        entry["state_dir"] = cfg.state_dir
        append(own_dir(fallback_dir(self.environ)), entry, cfg.log_max_bytes, cfg.log_keep)


def run(argv: list[str], t_main: float, environ=None) -> None:
    """Run one hook invocation to the end: output (if any) on stdout, one line in the log."""
    stdout_closed = claim_stdio()  # before the hook opens any file
    inv = Invocation(argv, t_main, os.environ if environ is None else environ, stdout_closed)
    try:
        _dispatch(inv)
    finally:
        try:
            if inv.event == "session_start" or inv.log.get("outcome") == "hit":
                # Before the log line, so its total covers the sweep the agent waits for too.
                t = time.monotonic()
                state.cleanup(inv.cfg.state_dir, min(t + state.CLEANUP_BUDGET_S, inv.until))
                inv.ms["cleanup"] = _ms(time.monotonic() - t)
        finally:
            inv.write_log()


def _dispatch(inv: Invocation) -> None:
    cfg = inv.cfg
    t = time.monotonic()
    # A stdin never closed ends the run with time left to log and exit, not at the deadline.
    raw, problem = _read_stdin(inv.until - EXIT_RESERVE_S)
    payload = None
    if raw is not None:
        try:
            payload = codec.loads(raw)  # a leading byte-order mark is skipped
        except ValueError:
            payload = None
    inv.ms["stdin"] = _ms(time.monotonic() - t)
    if problem == "no_budget_left":  # a timeout that sent nothing, as relay stats counts it
        return inv.finish("timeout", problem)
    if not isinstance(payload, dict):
        return inv.finish("skipped", problem or "bad_input")
    session_id = payload.get("session_id")
    session_id = session_id if isinstance(session_id, str) and session_id else None
    inv.log["session"] = session_id[:200] if session_id else None
    inv.log["prompt_id"] = _prompt_id(payload)
    if payload.get("hook_event_name") == "SessionStart":
        inv.event = inv.log["event"] = "session_start"
    if cfg.memory_off:
        return inv.finish("disabled", "memory_off")
    if cfg.key_kept_for:
        # RELAY_URL names another server than the config file's: its key is not sent there.
        inv.log["url"] = cfg.url
        return inv.finish("disabled", "key_elsewhere")
    if not cfg.url or not cfg.api_key:
        # A config file or a key that cannot be used is a broken install, not a machine never
        # set up.
        reason = "bad_config" if cfg.bad_file else "bad_key" if cfg.bad_key else "not_configured"
        return inv.finish("disabled", reason)
    try:
        parse_url(cfg.url)
    except ValueError:
        return inv.finish("disabled", "bad_url")
    if inv.stdout_closed:
        # Nothing could be shown: search nothing, and leave the session's state (its count,
        # its ledger, a compaction's reset) to a run of the hook that can answer.
        return inv.finish("skipped", "stdout_closed")
    if inv.event == "session_start":
        return _session_start(inv, payload, session_id)
    return _prompt(inv, payload, session_id)


def _prompt_id(payload: dict) -> str | None:
    """The agent's id for this prompt, `prompt_id` or else Codex's `turn_id`, as text: one sent
    as a JSON number is its decimal string, so the log line still joins to the agent's turn."""
    for name in ("prompt_id", "turn_id"):
        value = payload.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and value:
            return value[:200]
    return None


def _prompt(inv: Invocation, payload: dict, session_id: str | None) -> None:
    cfg = inv.cfg
    prompt_id = inv.log["prompt_id"]
    prompt = payload.get("prompt")
    if not isinstance(prompt, str):
        return inv.finish("skipped", "bad_input")
    prompt = prompt.strip()
    inv.log["prompt_sha256"] = sha256_hex(prompt.encode("utf-8", "surrogatepass"))[:16]
    inv.log["prompt_len"] = len(prompt)
    if cfg.log_prompt_text:
        inv.log["prompt"] = prompt[:QUERY_MAX_CHARS]
    t = time.monotonic()

    def skip(reason: str) -> None:  # from inside the session's lock, whose wait is gate time
        inv.ms["gate"] = _ms(time.monotonic() - t)
        return inv.finish("skipped", reason)

    words = gate.keywords(prompt)
    probe = False
    with _session(inv, session_id) as session:
        if not session.held:
            return skip("state_busy")
        data = session.data
        # One prompt reaching the hook twice (registered both for the user and in a committed
        # project's settings, the two commands differ, so the agent runs both) counts once:
        # known by its id, or, when the agent sends none, by its text arriving again with no
        # prompt between, as soon as two runs of one prompt would (see REPEAT_SLACK_S).
        last, now = data["last_prompt"], time.time()
        if prompt_id:
            if data["last_prompt_id"] == prompt_id:
                return skip("repeat_prompt")
        elif (
            last is not None
            and last["sha"] == inv.log["prompt_sha256"]
            and last["count"] == data["count"]  # no prompt since
            and 0 <= now - last["at"] < cfg.deadline_ms / 1000 + REPEAT_SLACK_S
        ):
            return skip("repeat_prompt")
        data["last_prompt_id"] = prompt_id
        data["count"] += 1
        data["last_prompt"] = {"sha": inv.log["prompt_sha256"], "at": now, "count": data["count"]}
        inv.log["prompt_no"] = data["count"]
        reason = gate.skip_reason(prompt, words, data, cfg)
        throttle_from = data["last_search"]
        if reason is None:
            allowed, probe = breaker.admit(
                cfg.state_dir, cfg.url, cfg.breaker_cooldown_s, inv.until
            )
            if allowed:
                # Now, so that a search that fails holds the throttle too; one answered with
                # nothing to inject gives it back (`_inject`).
                data["last_search"] = data["count"]
        session.save()
    inv.ms["gate"] = _ms(time.monotonic() - t)
    if reason is not None:
        return inv.finish("skipped", reason)
    if not allowed:
        return inv.finish("circuit_open")
    if probe:
        inv.log["probe"] = True

    server_ms = int((inv.until - time.monotonic() - config.PACK_RESERVE_S) * 1000)
    if server_ms < config.MIN_SERVER_MS:
        return inv.finish("timeout", "no_budget_left")
    inv.log["deadline_ms"] = server_ms
    # A lone surrogate (Claude Code's JSON may carry one, from a pasted half of an emoji) is
    # no UTF-8: the server refused the whole query with a 422, so the prompt recalled nothing
    # and was logged `invalid_response`. It goes as "?" instead.
    query = prompt[:QUERY_MAX_CHARS].encode("utf-8", "replace").decode()
    body = codec.dumps(
        {
            "query": query,
            "k": results_wanted(cfg.max_records),
            "deadline_ms": server_ms,
        }
    ).encode()
    records = _fetch(inv, "POST", "/v1/search", body, probe)
    if records is None:
        return _maybe_tell_unauthorized(inv, session_id)
    if cfg.min_score:
        kept = [r for r in records if (r["score"] or 0.0) >= cfg.min_score]
        if len(kept) < len(records):  # the hook's floor, not the server, kept these back
            inv.log["below_min_score"] = len(records) - len(kept)
        records = kept
    _inject(
        inv,
        session_id,
        records,
        cfg.max_records,
        cfg.max_tokens,
        (PROMPT_INTRO, PROMPT_REMINDER),
        "UserPromptSubmit",
        (words, throttle_from),
    )


def _session_start(inv: Invocation, payload: dict, session_id: str | None) -> None:
    cfg = inv.cfg
    source = payload.get("source")
    source = source if source in SOURCES else "startup"
    inv.log["source"] = source
    if session_id:
        with _session(inv, session_id) as session:
            if not session.held:
                return inv.finish("skipped", "state_busy")
            # One session start reaching the hook twice (registered for the user and in the
            # project, run concurrently or in turn) counts once: a second reset would wipe
            # the profile the first run recorded, and it would be injected again.
            last, now = session.data["start"], time.time()
            if (
                last is not None
                and last["source"] == source
                and last["count"] == session.data["count"]  # no prompt since
                and 0 <= now - last["at"] < cfg.deadline_ms / 1000 + REPEAT_SLACK_S
            ):
                return inv.finish("skipped", "repeat_start")
            if source in ("clear", "compact"):
                keep_notice = session.data["told_unauthorized"]
                session.data = state.fresh(session_id)
                session.data["told_unauthorized"] = keep_notice
                inv.log["ledger_reset"] = True
            session.data["start"] = {"source": source, "at": now, "count": session.data["count"]}
            session.save()
    if not cfg.profile:
        return inv.finish("skipped", "profile_off")
    allowed, probe = breaker.admit(cfg.state_dir, cfg.url, cfg.breaker_cooldown_s, inv.until)
    if not allowed:
        return inv.finish("circuit_open")
    records = _fetch(inv, "GET", "/v1/profile", None, probe)
    if records is None:
        return _maybe_tell_unauthorized(inv, session_id)
    # The profile carries whole memories: one shown whole counts as every passage of its
    # revision; one shown cut counts as none (pack marks it), so its passages still come in.
    for record in records:
        record["passage"] = record["passages"] = None
    _inject(
        inv,
        session_id,
        records,
        cfg.profile_max_records,
        cfg.profile_max_tokens,
        (PROFILE_INTRO, None),
        "SessionStart",
        None,
    )


def _fetch(
    inv: Invocation, method: str, path: str, body: bytes | None, probe: bool
) -> list[dict] | None:
    """Validated records, or None with the failure outcome recorded."""
    cfg = inv.cfg
    t = time.monotonic()
    outcome = "no_match"
    inv.log["url"] = cfg.url  # which server this outcome speaks of (relay stats' streaks)
    inv.log["key"] = key_label(cfg.api_key)  # and which key: a 401 is that key's
    key_from = cfg.origin.get(cfg.key_setting, "")
    if key_from.startswith("RELAY_"):  # the agent's environment, in place of the config file
        inv.log["key_from"] = key_from
    try:
        status, raw = request(
            method,
            cfg.url,
            path,
            cfg.api_key,
            body,
            inv.until - EXIT_RESERVE_S,
            RESPONSE_MAX,
            inv.ms,
        )
        inv.log["http_status"] = status
        if status in (401, 403):
            raise HookFailure("unauthorized", f"HTTP {status}")
        if status in (408, 429) or status >= 500:
            raise HookFailure("unavailable", f"HTTP {status}")
        if status != 200:
            raise HookFailure("invalid_response", f"HTTP {status}")
        inv.ms["net"] = _ms(time.monotonic() - t)
        t = time.monotonic()
        try:
            payload = codec.loads(raw)
        except ValueError:
            raise HookFailure("invalid_response", "body is not JSON") from None
        records = validate(payload)  # so payload is a dict
        took = payload.get("took_ms")  # type: ignore[attr-defined]
        if took is not None:
            inv.log["server_ms"] = took
        inv.ms["parse"] = _ms(time.monotonic() - t)
        if starved(payload, records):  # type: ignore[arg-type]
            # Not "nothing on this topic": the topic stays unsearched, and a run of these
            # counts towards the breaker and the streaks of relay stats and relay doctor.
            raise HookFailure("timeout", "server_out_of_time")
        return records
    except HookFailure as failure:
        outcome = failure.outcome
        inv.ms.setdefault("net", _ms(time.monotonic() - t))
        inv.finish(failure.outcome, failure.detail[:200])
        return None
    finally:
        breaker.record(cfg.state_dir, cfg.url, outcome, cfg.breaker_failures, probe)


def _maybe_tell_unauthorized(inv: Invocation, session_id: str | None) -> None:
    """Once per session, a one-line systemMessage for the user (never context for the model)."""
    if inv.log["outcome"] != "unauthorized" or not session_id:
        return
    with _session(inv, session_id) as session:
        if session.held and not session.data["told_unauthorized"]:
            status = inv.log.get("http_status", 401)
            if _emit(inv, {"systemMessage": UNAUTHORIZED_MESSAGE.format(status=status)}) is None:
                session.data["told_unauthorized"] = True
                session.save()


def _inject(
    inv: Invocation,
    session_id: str | None,
    records: list[dict],
    max_records: int,
    max_tokens: int,
    intros: tuple[str, str | None],
    event_name: str,
    searched: tuple[list[str], int] | None,
) -> None:
    """Pack what the ledger lacks, print it, then record it: the ledger is what was shown.
    `searched`, for a prompt: its keywords, and the prompt the throttle counted from before
    this search."""
    t = time.monotonic()
    inv.log["results"] = len(records)
    with _session(inv, session_id) as session:
        if not session.held:
            return inv.finish("skipped", "state_busy")
        data = session.data
        # The whole stdout stays under OUTPUT_MAX_CHARS, whatever the token budget.
        context, injected, dupes = pack(
            records,
            data["ledger"],
            max_records,
            max_tokens,
            *intros,
            max_chars=context_room(event_name),
            shown=data["shown"],
        )
        inv.ms["pack"] = _ms(time.monotonic() - t)
        inv.log["duplicates"] = dupes
        inv.log["records"] = inv.log["tokens"] = 0
        if searched is not None:
            words, throttle_from = searched
            data["keywords"] = words  # the topic was asked: a rephrasing of it is same_topic
            if context is None and data["last_search"] == inv.log["prompt_no"]:
                # Nothing injected: the next prompts, a new topic say, are not throttled.
                data["last_search"] = throttle_from
        if context is None:
            inv.finish("no_match")
        else:
            output = {"hookEventName": event_name, "additionalContext": context}
            # Nothing shown, so nothing enters the ledger.
            failed = _emit(inv, {"hookSpecificOutput": output})
            if failed == "late":
                return inv.finish("timeout", failed)
            if failed:
                return inv.finish("skipped", failed)
            inv.finish("hit")
            inv.log["records"] = len(injected)
            inv.log["tokens"] = tokens(context)
            inv.log["injected"] = [[r["id"], r["revision"]] for r in injected]
            for record in injected:
                ledger_add(data["ledger"], record, data["shown"])
        session.save()


def _session(inv: Invocation, session_id: str | None):
    """The session's locked state; an unsaved scratch state when the agent sent no session id
    (and, through state.Session, when the state folder cannot be written)."""
    if session_id:
        return state.Session(inv.cfg.state_dir, session_id, inv.until, inv.state_failed)
    return _Scratch()


class _Scratch:
    held = True

    def __enter__(self):
        self.data = state.fresh("")
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def save(self) -> None:
        pass
