"""`relay stats`: what the recall hook did over a period, read from its outcome log.

Not on the hook's hot path; the hook only appends to `<state_dir>/outcomes.jsonl`
(see docs/hook.md). A streak of `unauthorized` (a broken key) or of
`timeout`/`unavailable` (a server that is down) is reported loudly here and by
`relay doctor` through `problems()`, never to the model.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from array import array
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from relay.hook import config as hook_config
from relay.hook.codec import finite, no_constant
from relay.hook.files import is_own_dir
from relay.hook.outcome_log import LOG_NAME, fallback_dir, key_label, timestamp
from relay.numerals import is_decimal

OUTCOMES = (
    "hit",
    "no_match",
    "timeout",
    "unavailable",
    "unauthorized",
    "invalid_response",
    "skipped",
    "disabled",
    "circuit_open",
)
SEARCHED = ("hit", "no_match", "timeout", "unavailable", "unauthorized", "invalid_response")
UNAVAILABLE_STREAK_ALERT = 3
UNSENT = "timeout:no_budget_left"  # the hook's reason for a timeout that made no request
# A no_match whose server answer min_score dropped whole: a floor set too high shows here.
FLOORED = "no_match:below_min_score"
# Skips after the server answered: the answer could not be written (the agent stopped
# reading, or stdout failed), so nothing was shown, but the run searched like a hit.
UNSHOWN = ("skipped:stdout_broken_pipe", "skipped:stdout_unwritable")
# How the hook opens each line (`outcome_log.timestamp`): one format, so stamps sort as text.
_STAMPED = re.compile(r'\{"ts":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"')
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


_LONGEST = 100 * 365 * 86400  # beyond it a start date is before any log (or year 1)


def parse_since(text: str) -> float:
    """'90s', '30m', '24h', '7d', '2w', '1.5h' -> seconds. The number is read by the rule of
    every decimal option (`relay.numerals`): float() took `1_0d` as ten days."""
    text = text.strip().lower()
    if len(text) < 2 or text[-1] not in _UNITS or not is_decimal(text[:-1]):
        raise ValueError(f"period {text!r} is not a number followed by s, m, h, d or w")
    value = float(text[:-1])
    if not value > 0 or math.isinf(value):
        raise ValueError(f"period {text!r} must be positive")
    seconds = value * _UNITS[text[-1]]
    if seconds > _LONGEST:
        raise ValueError(f"period {text!r} is longer than 100 years: 'all' means everything")
    return seconds


def _ts(entry: dict) -> float | None:
    raw = entry.get("ts")
    if not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def read_entries(state_dir: str, since: float | None = None) -> Iterator[dict]:
    """Log entries, oldest first across rotated files, at or after `since` (epoch seconds):
    those in `state_dir`, and those a hook that could not write `state_dir` logged in its
    fallback folder (`outcome_log.fallback_dir`), merged by time."""
    import heapq

    own = _read_log(os.path.join(state_dir, LOG_NAME), since)
    mine = os.path.abspath(os.path.expanduser(state_dir))
    fallback = fallback_dir(os.environ)
    # Only a folder the hook would log in: one another user made there is none of our runs.
    found = _read_log(os.path.join(fallback, LOG_NAME), since) if is_own_dir(fallback) else ()
    elsewhere = (
        entry
        for entry in found
        if isinstance(entry.get("state_dir"), str) and os.path.abspath(entry["state_dir"]) == mine
    )
    # ISO 8601 UTC stamps of one format sort as text.
    yield from heapq.merge(own, elsewhere, key=lambda entry: str(entry.get("ts", "")))


def _read_log(path: str, since: float | None) -> Iterator[dict]:
    """One log's entries, oldest first across its rotated files, at or after `since`."""
    rotated = []
    n = 1
    while os.path.exists(f"{path}.{n}"):
        rotated.append(f"{path}.{n}")
        n += 1
    # A line stamped before the period is passed over unparsed, and so is a rotated file last
    # written before it (with a second's slack for the file clock's coarser ticks): parsing
    # every line of a 1 GiB log took `relay stats` and `relay doctor` two minutes for a day.
    first = None if since is None else timestamp(since)
    for name in [*reversed(rotated), path]:
        try:
            if since is not None and name != path and os.stat(name).st_mtime < since - 1:
                continue
            with open(name, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    stamped = _STAMPED.match(line) if first is not None else None
                    if stamped is not None and first is not None and stamped[1] < first:
                        continue
                    try:
                        entry = json.loads(line, parse_float=finite, parse_constant=no_constant)
                    except ValueError:
                        continue  # a torn line from a crash is not worth failing over
                    if not isinstance(entry, dict):
                        continue
                    when = _ts(entry)
                    if since is not None and (when is None or when < since):
                        continue
                    yield entry
        except OSError:
            continue


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """Nearest-rank p50/p95/p99 (zeros when there is nothing to rank)."""
    if not values:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pick(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1)], 2)

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99)}


def _unsent(entry: dict) -> bool:
    """A timeout before any request: the budget was gone before the process could read
    stdin (it started late) or before the gate had decided, so it searched nothing and
    says nothing about the server."""
    return f"{entry.get('outcome')}:{entry.get('reason')}" == UNSENT


def _unshown(entry: dict) -> bool:
    """A run the server answered whose answer could not be written: it searched."""
    return f"{entry.get('outcome')}:{entry.get('reason')}" in UNSHOWN


def _searched_reason(key: str) -> bool:
    """Whether runs logged with reason `key` (outcome:reason) searched: a timeout's do,
    but for one that sent nothing; a skip's only when the answer came and went unshown; a
    no_match's (below_min_score) always."""
    return key in (*UNSHOWN, FLOORED) or (key.split(":", 1)[0] == "timeout" and key != UNSENT)


def _elsewhere(entry: dict, url: str) -> bool:
    """A run that asked another server than `url`; with no `url` configured here (stats
    read without the hook's settings) every run counts, as does a line logged without one."""
    return bool(url) and entry.get("url", url) != url


def _other_key(entry: dict, key: str) -> bool:
    """A run that sent another key than `key` (a `key_label`); with no key given every run
    counts, as does a line logged without one."""
    return bool(key) and entry.get("key", key) != key


class _Streak:
    """The trailing run of searches of `url` ending in `outcomes`, with `key` when given, kept
    as the log is read oldest first: breaker skips, and runs that asked another server
    (`RELAY_URL` set for one session) or sent another key, neither break nor count. Read
    line by line rather than from a list of every entry: `--since all` on a 256 MB log held
    2 GB."""

    def __init__(self, outcomes: tuple[str, ...], url: str, key: str = "") -> None:
        self.outcomes, self.url, self.key = outcomes, url, key
        self.length, self.since = 0, None

    def copy(self, key: str) -> _Streak:
        """This streak as far as read, continued as `key`'s (one that read no line of its own)."""
        other = _Streak(self.outcomes, self.url, key)
        other.length, other.since = self.length, self.since
        return other

    def feed(self, entry: dict) -> None:
        outcome = entry.get("outcome")
        if outcome == "circuit_open" or _unsent(entry) or _elsewhere(entry, self.url):
            return
        if _other_key(entry, self.key):
            return
        if outcome not in SEARCHED and not _unshown(entry):
            return
        if outcome not in self.outcomes:  # an answer, even one left unshown, ends a streak
            self.length, self.since = 0, None
            return
        self.length += 1
        if self.length == 1:
            self.since = entry.get("ts")

    def result(self) -> dict[str, Any]:
        return {"length": self.length, "since": self.since}


class _RejectedKeys:
    """The `unauthorized` streaks of the keys other than `configured` that searches of `url`
    sent (RELAY_API_KEY in an agent's environment, or a key since replaced), kept as the log
    is read: each with the key's id and, when the agent's environment set it, the variable
    (`from`). None without a configured key: then every run counts in the one streak."""

    def __init__(self, url: str, configured: str) -> None:
        self.url, self.configured = url, configured
        # A line logged without a key counts for every key; a key first seen later starts
        # from the streak of those lines.
        self.unkeyed = _Streak(("unauthorized",), url)  # fed only the lines without a key
        self.streaks: dict[str, _Streak] = {}
        self.last: dict[str, tuple[int, Any]] = {}  # key -> (line, key_from) of its latest
        self.n = 0

    def feed(self, entry: dict) -> None:
        if not self.configured:
            return
        self.n += 1
        key = entry.get("key")
        if "key" not in entry:
            self.unkeyed.feed(entry)
            for streak in self.streaks.values():
                streak.feed(entry)
            return
        if not isinstance(key, str) or key == self.configured:
            return
        if key not in self.streaks:
            self.streaks[key] = self.unkeyed.copy(key)
        self.streaks[key].feed(entry)
        if not _elsewhere(entry, self.url):
            self.last[key] = (self.n, entry.get("key_from"))

    def result(self) -> list[dict[str, Any]]:
        out = []
        for key in sorted(self.last, key=lambda k: -self.last[k][0]):  # newest first
            streak = self.streaks[key].result()
            if streak["length"]:
                out.append({"key": key, "from": self.last[key][1], **streak})
        return out


def breaker_state(state_dir: str, cfg: dict) -> dict[str, Any]:
    """The breaker of the configured URL, as the hook reads it: state that a run with
    another URL left (RELAY_URL set for one session, say) is not this URL's."""
    from relay.hook import breaker

    found = breaker.status(state_dir, cfg["url"], cfg["breaker_cooldown_s"])
    out: dict[str, Any] = {
        "state": found["state"],
        "failures": found["failures"],
        "url": cfg["url"] or None,
    }
    if found["opened_at"] is not None:
        out["opened_at"] = _iso(found["opened_at"])
    return out


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def summarise(
    state_dir: str,
    since_s: float | None = 86400,
    now: float | None = None,
    cfg: hook_config.Config | None = None,
) -> dict:
    """Counts per outcome, hook time percentiles, injected tokens, duplicates, streaks, and
    the breaker of `cfg`'s URL (default: the hook's settings from this environment)."""
    now = time.time() if now is None else now
    since = None if since_s is None else now - since_s
    cfg = hook_config.load() if cfg is None else cfg
    configured = key_label(cfg.api_key) if cfg.api_key else ""
    unauthorized = _Streak(("unauthorized",), cfg.url, configured)
    unavailable = _Streak(("timeout", "unavailable"), cfg.url)
    rejected = _RejectedKeys(cfg.url, configured)
    invocations = 0
    counts = dict.fromkeys(OUTCOMES, 0)
    reasons: dict[str, int] = {}
    totals, hit_totals = array("d"), array("d")  # 8 bytes a run, not a parsed line each
    records = tokens = dupes = 0
    state_errors: dict[str, int] = {}
    for entry in read_entries(state_dir, since):
        invocations += 1
        for streak in (unauthorized, unavailable, rejected):
            streak.feed(entry)
        if isinstance(entry.get("state_error"), str):
            state_errors[entry["state_error"]] = state_errors.get(entry["state_error"], 0) + 1
        outcome = entry.get("outcome")
        if outcome in counts:
            counts[outcome] += 1
        if outcome in ("skipped", "disabled", "timeout") and isinstance(entry.get("reason"), str):
            key = f"{outcome}:{entry['reason']}"
            reasons[key] = reasons.get(key, 0) + 1
        elif outcome == "no_match" and _num(entry.get("below_min_score")):
            # The server found something; the hook's min_score kept all of it back.
            reasons[FLOORED] = reasons.get(FLOORED, 0) + 1
        ms = entry.get("ms")
        total = ms.get("total") if isinstance(ms, dict) else None
        if isinstance(total, int | float):
            totals.append(float(total))
            if outcome == "hit":
                hit_totals.append(float(total))
        records += _num(entry.get("records"))
        tokens += _num(entry.get("tokens"))
        dupes += _num(entry.get("duplicates"))
    unsent = reasons.get(UNSENT, 0)
    unshown = sum(reasons.get(key, 0) for key in UNSHOWN)
    searched = {o: counts[o] - (unsent if o == "timeout" else 0) for o in SEARCHED}
    not_searched = {o: counts[o] for o in OUTCOMES if o not in SEARCHED and counts[o]}
    if unsent:
        not_searched["timeout"] = unsent
    if unshown:
        searched["skipped"] = unshown
        not_searched["skipped"] -= unshown
        if not not_searched["skipped"]:
            del not_searched["skipped"]
    summary: dict[str, Any] = {
        "state_dir": state_dir,
        "since": None if since is None else _iso(since),
        "until": _iso(now),
        "invocations": invocations,
        "outcomes": counts,
        "searched": searched,
        "not_searched": not_searched,
        "skip_reasons": dict(sorted(reasons.items())),
        "hook_ms": percentiles(totals),
        "hit_ms": percentiles(hit_totals),
        "injected": {
            "records": records,
            "tokens": tokens,
            "tokens_per_hit": round(tokens / counts["hit"], 1) if counts["hit"] else 0.0,
        },
        "duplicates_avoided": dupes,
        # Runs that could not write the state folder, by why: no throttle and no ledger.
        "state_errors": state_errors,
        # The configured key's: a 401 another key got says nothing of it.
        "unauthorized_streak": {**unauthorized.result(), "key": configured or None},
        "rejected_keys": rejected.result(),
        "unavailable_streak": unavailable.result(),
        "breaker": breaker_state(state_dir, cfg),
    }
    summary["problems"] = problems(summary)
    return summary


def problems(summary: dict) -> list[str]:
    """Loud, one-line findings for `relay stats` and `relay doctor`."""
    out = []
    streak = summary["unauthorized_streak"]
    if streak["length"]:
        key = f" {streak['key']}" if streak["key"] else ""
        out.append(
            f"the last {streak['length']} searches were rejected (401/403) since "
            f"{streak['since']}: the hook's API key{key} is revoked, expired or lacks "
            "memory:read; recall is off until it is fixed"
        )
    out += [
        env_key_problem(rejected, streak["key"])
        for rejected in summary["rejected_keys"]
        if rejected["from"]
    ]
    down = summary["unavailable_streak"]["length"]
    if down >= UNAVAILABLE_STREAK_ALERT:
        out.append(
            f"the last {down} searches timed out or found no server since "
            f"{summary['unavailable_streak']['since']}: check that the server at "
            f"{summary['breaker'].get('url') or 'the configured URL'} is up and reachable from here"
            " (relay doctor checks each link)"
        )
    breaker = summary["breaker"]
    if breaker["state"] != "closed":
        out.append(f"the hook's circuit breaker for {breaker['url']} is {breaker['state']}")
    failed = summary["state_errors"]
    if failed:
        why = ", ".join(f"{reason}: {_runs(n)}" for reason, n in sorted(failed.items()))
        out.append(
            f"{_runs(sum(failed.values()))} could not write the hook's state folder "
            f"{summary['state_dir']} ({why}): each prompt is searched without its session's "
            "throttle and ledger, so records repeat; `relay doctor` says how to fix it"
        )
    return out


def env_key_problem(rejected: dict[str, Any], configured: str) -> str:
    """A key an agent's environment set in place of the configured one (`rejected`, one of
    `rejected_keys`), rejected on its last searches: those prompts recall nothing."""
    return (
        f"key {rejected['key']}, which {rejected['from']} in an agent's environment set in "
        f"place of the configured key {configured}, was rejected (401/403) on "
        f"{last_searches(rejected['length'])} since {rejected['since']}: prompts run there "
        f"recall nothing until {rejected['from']} is unset or names a valid key"
    )


def last_searches(n: int) -> str:
    return "the last search" if n == 1 else f"the last {n} searches"


def _num(value: object) -> int:
    return value if type(value) is int else 0


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _outcome_lines(counts: dict[str, int], reasons: dict[str, int]) -> list[str]:
    """Each outcome's count, and under it its reasons' (`reasons` keys are outcome:reason)."""
    lines = []
    for outcome, count in counts.items():
        lines.append(f"    {outcome:<17} {count}")
        for key, n in reasons.items():
            if key.startswith(outcome + ":"):
                lines.append(f"      {key.split(':', 1)[1]:<25} {n}")
    return lines


def render(summary: dict) -> str:
    """The summary as a short text report; problems first, in capitals."""
    lines = [f"PROBLEM: {p}" for p in summary["problems"]]
    if lines:
        lines.append("")
    period = f"since {summary['since']}" if summary["since"] else "all time"
    lines.append(f"Relay hook, {period} ({summary['invocations']} prompts and session starts)")
    searched, others = summary["searched"], summary["not_searched"]
    reasons = summary["skip_reasons"]
    for label, counts, searched_side in (
        ("searched", searched, True),
        ("not searched", others, False),
    ):
        total = sum(counts.values())
        lines.append(f"  {label} {total}" + (", of which:" if total else ""))
        picked = {k: n for k, n in reasons.items() if _searched_reason(k) == searched_side}
        lines += _outcome_lines(counts, picked)
    for label, ms, runs in (
        ("hook time ms", summary["hook_ms"], summary["invocations"]),
        ("on hits ms", summary["hit_ms"], summary["outcomes"]["hit"]),
    ):
        shown = f"p50 {ms['p50']}  p95 {ms['p95']}  p99 {ms['p99']}" if runs else "- (none)"
        lines.append(f"  {label:<17} {shown}")
    inj = summary["injected"]
    lines.append(
        f"  injected          {inj['records']} records, {inj['tokens']} tokens "
        f"({inj['tokens_per_hit']} per hit)"
    )
    lines.append(f"  duplicates avoided {summary['duplicates_avoided']}")
    for rejected in summary["rejected_keys"]:
        if not rejected["from"]:  # no longer sent: a key since replaced, or another config's
            lines.append(
                f"  key {rejected['key']} rejected (401/403) on"
                f" {last_searches(rejected['length'])} since {rejected['since']}, and is not"
                f" the key configured here ({summary['unauthorized_streak']['key']})"
            )
    b = summary["breaker"]
    where = f" for {b['url']}" if b.get("url") else ""
    lines.append(
        f"  breaker           {b['state']}{where} (consecutive failures {b.get('failures', 0)})"
    )
    return "\n".join(lines)


@click.command("stats")
@click.option(
    "--since",
    default="24h",
    show_default=True,
    help="Period to summarise: a number and s, m, h, d or w ('all' for everything).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--state-dir",
    # A directory that is not there has no hook state: it read as 0 prompts and a closed
    # breaker for the configured URL, a report about nothing.
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="The hook's state directory (default: the hook's own, RELAY_STATE_DIR, else the "
    "config's state_dir, else ~/.relay/state).",
)
@click.option(
    "--send",
    is_flag=True,
    help="Also send the counts, streaks and hook times (no prompts, no paths) to the Relay "
    "server (the hook's, with its key), where the team console charts broken installs.",
)
@click.option("--as", "developer", default=None, help="Name to send under (default: key name).")
def stats(
    since: str, as_json: bool, state_dir: str | None, send: bool, developer: str | None
) -> None:
    """Summarise the recall hook's outcomes: counts, hook time, tokens, streaks, breaker."""
    try:
        since_s = None if since.strip().lower() == "all" else parse_since(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    client = None
    if send:  # before the report: with no server to send to, the error alone
        from relay.client import RelayClient

        client = RelayClient.from_config(flags=False).require_key()
    summary = summarise(state_dir or hook_config.load().state_dir, since_s)
    if as_json:
        click.echo(json.dumps(summary, indent=2, allow_nan=False))
    else:
        click.echo(render(summary))
    if client is not None:
        answer = client.post("/v1/hook-outcomes", report(summary, developer))
        click.echo(f"sent to {client.url} as {answer['developer']}", err=True)


def report(summary: dict, developer: str | None = None) -> dict:
    """What `--send` shares: aggregates only, never the state directory or prompt details."""
    keep = ("since", "until", "invocations", "outcomes", "hook_ms")
    out = {k: summary[k] for k in keep}
    out["unauthorized_streak"] = summary["unauthorized_streak"]
    out["unavailable_streak"] = summary["unavailable_streak"]
    out["breaker"] = {"state": summary["breaker"]["state"]}
    if developer:
        out["developer"] = developer
    return out
