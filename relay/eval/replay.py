"""`relay eval replay`: conversations through the real hook and a real server, turn by turn,
with recall on, off and ungated in the same run.

  on       the hook as installed: gates, ledger, deadline (knobs from --config if given)
  off      the same process with the kill switch (RELAY_MEMORY_OFF=1): the floor
  ungated  no gating and no dedupe: every prompt searches (no minimum length, no
           throttle, an overlap threshold above 1) in a fresh session, so the ledger
           never drops anything; the cost of injecting on every turn
The three runs of a turn are interleaved so load on the machine hits them alike,
and each mode reads with its own key, so no mode is served another's cached answers.

What the model saw is read from the hook's stdout; the outcome from its log line.
A duplicate is a passage of a record revision injected into a conversation that already
holds that passage of that revision (no compaction happens in a replay); another passage
of a long memory, which the model has not seen, is not one. Cumulative tokens count what stays in
history: a record injected at turn t of T is paid again on each of turns t..T.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from relay.eval.conversations import (
    MEMORY_CLASSES,
    QUIET_CLASSES,
    UNLABELLED,
    Conversation,
    Turn,
    kept_in_history,
)
from relay.eval.harness import Hook, OrgKeys, Progress, Run
from relay.hook.pack import tokens
from relay.hook_bench import ON_TIME_SLACK_MS
from relay.hook_stats import OUTCOMES, SEARCHED, percentiles

MODES = ("on", "off", "ungated")
MODE_ENV = {
    "on": {},
    "off": {"RELAY_MEMORY_OFF": "1"},
    # The issue's baseline: every prompt searched and every result injected, without gating
    # (throttle, short prompts, topic overlap, the hook's min_score floor) or dedupe.
    "ungated": {
        "RELAY_THROTTLE_PROMPTS": "0",
        "RELAY_MIN_PROMPT_LEN": "0",
        "RELAY_OVERLAP_THRESHOLD": "1.5",
        "RELAY_MIN_SCORE": "0",
    },
}
_RECORD = re.compile(r'<relay-memory id="([^"]*)" revision="(\d+)"(?: part="(\d+)[^"]*")?')


def injected_records(context: str | None) -> list[tuple[str, int, int]]:
    """(id, revision, passage) of every record in an injected context, in order. The passage
    is the API's number (the label's `part` counts from 1); 0 for a record whose label names
    no part: a memory of one passage, or a whole one (the team profile)."""
    return [
        (m[1], int(m[2]), int(m[3]) - 1 if m[3] else 0) for m in _RECORD.finditer(context or "")
    ]


_CUT = re.compile(
    r"(<relay-memory [^>]*>)\n(?:(?!</relay-memory>).)* \[truncated\]\n</relay-memory>", re.S
)


def shown_whole(context: str | None) -> list[tuple[str, int, int]]:
    """`injected_records` less those shown cut (`[truncated]`): as the hook's ledger, a cut
    record counts as not seen, so its coming back whole later is no duplicate."""
    cut = {r for m in _CUT.finditer(context or "") for r in injected_records(m[1])}
    return [r for r in injected_records(context) if r not in cut]


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def replay(
    conversations: list[Conversation],
    url: str,
    keys: dict[str, OrgKeys],
    homes: Path,
    deadline_ms: int,
    knobs: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Every turn of every conversation in every mode; one row per (turn, mode). `knobs`:
    the `on` mode's variables (`advice.knob_environ`: its config, the script's knobs)."""
    hooks: dict[tuple[str, str], Hook] = {}

    def hook(store: str, mode: str) -> Hook:
        if (store, mode) not in hooks:
            env = dict(MODE_ENV[mode])
            if mode == "on":
                env.update(knobs or {})
            home = homes / f"{mode}-{len(hooks)}"
            hooks[store, mode] = Hook(home, url, keys[store].read[mode], deadline_ms, **env)
        return hooks[store, mode]

    rows: list[dict[str, Any]] = []
    total = sum(len(c.turns) for c in conversations)
    done, started = 0, time.monotonic()
    for n, conv in enumerate(conversations, 1):
        state = {mode: _Context() for mode in MODES}
        for turn in conv.turns:
            for mode in MODES:
                session = conv.id if mode != "ungated" else f"{conv.id}#{turn.no}"
                run = hook(conv.store, mode).prompt(
                    turn.prompt, _session_name(session), f"{conv.id}:{turn.no}:{mode}"
                )
                rows.append(state[mode].account(turn, mode, run, len(conv.turns)))
            done += 1
        if progress:
            rate = done / max(time.monotonic() - started, 1e-9)
            progress(
                f"replay: conversation {n}/{len(conversations)}, {done}/{total} turns, "
                f"{rate:.1f} turns/s, about {(total - done) / rate:.0f} s left"
            )
    return rows


def _session_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)


class _Context:
    """What one conversation's context holds so far, in one mode."""

    def __init__(self) -> None:
        self.passages: set[tuple[str, int, int]] = set()
        self.ids: set[str] = set()
        self.text = ""

    def account(self, turn: Turn, mode: str, run: Run, length: int) -> dict[str, Any]:
        context = run.context
        records = injected_records(context)
        dupes = sum(shown in self.passages for shown in records)
        self.passages.update(shown_whole(context))
        self.ids.update(rid for rid, _, _ in records)
        if context:
            self.text += " " + _normal(context)
        spent = tokens(context) if context else 0
        return {
            "conversation": turn.conversation,
            "turn": turn.no,
            "turns": length,
            "kind": turn.kind,
            "source_kind": turn.source_kind,
            "mode": mode,
            "prompt_len": len(turn.prompt),
            "ms": round(run.ms, 2),
            # The hook's own clock, phase by phase (start, stdin, gate, request, ...): what a
            # late turn spent its time on.
            "hook_phases_ms": run.log.get("ms") or {},
            "rc": run.rc,
            "outcome": run.outcome,
            "reason": run.log.get("reason"),
            "tokens": spent,
            "records": len(records),
            "injected": [list(p) for p in records],
            "duplicates": dupes,
            "useful": any(g in self.ids for g in turn.relevant) if turn.relevant else None,
            "gold_injected": any(rid in turn.relevant for rid, _, _ in records),
            "answered": _normal(turn.answer) in self.text if turn.answer else None,
            "quiet": context is None,
            "logged_hit": run.outcome == "hit",
        }


# -- figures -------------------------------------------------------------------------
def _rate(values: list[bool | None]) -> float | None:
    """The share of True among the values that were measured (None: not measurable, e.g.
    usefulness of a prompt whose row names no gold memory); None when none were."""
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def figures(rows: list[dict[str, Any]], conversations: int, classes: bool = True) -> dict[str, Any]:
    """The issue's `R`: hook_ms, outcomes, tokens, duplicate/useful/quiet rates, by_class."""
    counts = Counter(r["outcome"] for r in rows)
    injected = sum(r["records"] for r in rows)
    out: dict[str, Any] = {
        "hook_ms": percentiles([r["ms"] for r in rows]),
        "outcomes": {o: counts[o] for o in (*OUTCOMES, *sorted(set(counts) - set(OUTCOMES)))},
        "tokens_per_turn": round(statistics.fmean(r["tokens"] for r in rows), 2) if rows else 0.0,
        "tokens_cumulative": round(
            sum(kept_in_history(r["tokens"], r["turn"], r["turns"]) for r in rows)
            / max(conversations, 1),
            1,
        ),
        "duplicate_rate": round(sum(r["duplicates"] for r in rows) / injected, 4)
        if injected
        else 0.0,
    }
    if classes:
        out["useful_rate"] = _rate([r["useful"] for r in rows if r["kind"] in MEMORY_CLASSES])
        out["quiet_rate"] = _rate([r["quiet"] for r in rows if r["kind"] in QUIET_CLASSES])
        by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_kind[r["kind"]].append(r)
        out["by_class"] = {k: figures(v, conversations, False) for k, v in sorted(by_kind.items())}
    else:
        out.update(_class_rates(rows))
    return out


def _class_rates(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """useful_rate and quiet_rate of one class's rows; none for unlabelled rows, whose
    class nobody gave: whether they should have got something is unknown."""
    rated = [r for r in rows if r["kind"] != UNLABELLED]
    return {
        "useful_rate": _rate([r["useful"] for r in rated]),
        "quiet_rate": _rate([r["quiet"] for r in rated]),
    }


def public(rows: list[dict[str, Any]], conversations: int) -> dict[str, Any]:
    """Exactly the schema of `relay eval replay --json`."""
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in MODES}
    turns = len(by_mode["on"])
    return {
        "conversations": conversations,
        "turns": turns,
        **{m: figures(by_mode[m], conversations) for m in MODES},
    }


# What the server, not recall, did to a hook run: it went away, refused the key, answered
# garbage. A timeout stays a measurement (of latency on this machine, `over_deadline`).
SERVER_FAILURES = ("unavailable", "unauthorized", "invalid_response")


def server_failures(rows: list[dict[str, Any]]) -> str | None:
    """Why the figures measure the server rather than recall, or None: the modes that search
    met a failed server, after the check before the replay passed (it went down or was
    restarted part of the way in, a key was revoked). Those turns got nothing, so they read
    as quiet and not useful, and the ungated run's tokens, which the advice's token target
    divides, shrink with them; the circuit_open runs that followed are named too."""
    searching = [r for r in rows if r["mode"] != "off"]
    failed = Counter(r["outcome"] for r in searching if r["outcome"] in SERVER_FAILURES)
    if not failed:
        return None
    failed["circuit_open"] = sum(r["outcome"] == "circuit_open" for r in searching)
    how = ", ".join(f"{o} {n}" for o, n in failed.items() if n)
    return (
        f"{failed.total()} of the {len(searching)} hook runs that search got no answer from "
        f"the server ({how}), so these figures measure that, not recall; replay once "
        "`relay doctor` finds the server well"
    )


def extras(rows: list[dict[str, Any]], deadline_ms: int) -> dict[str, Any]:
    """Figures behind the report beyond the schema: latency per outcome, added latency,
    uplift, answers found, the data's own slices, and the series the plots draw."""
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in MODES}
    out: dict[str, Any] = {"modes": {}}
    for mode, mine in by_mode.items():
        per_outcome: dict[str, list[float]] = defaultdict(list)
        for r in mine:
            per_outcome[r["outcome"]].append(r["ms"])
        totals = [
            r["hook_phases_ms"]["total"]
            for r in mine
            if isinstance(r["hook_phases_ms"].get("total"), int | float)
        ]
        late = [r for r in mine if r["ms"] > deadline_ms + ON_TIME_SLACK_MS]
        slices: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in mine:
            slices[f"{r['kind']}:{r['source_kind'] or '-'}"].append(r)
        out["modes"][mode] = {
            "hook_ms_by_outcome": {o: percentiles(v) for o, v in sorted(per_outcome.items())},
            "hook_own_clock_ms": percentiles(totals),
            "max_ms": round(max((r["ms"] for r in mine), default=0.0), 1),
            "over_deadline": len(late),
            "late_turns": [
                {
                    k: r[k]
                    for k in ("conversation", "turn", "ms", "outcome", "reason", "hook_phases_ms")
                }
                for r in late
            ],
            "mean_ms": round(statistics.fmean(r["ms"] for r in mine), 2) if mine else 0.0,
            "searched": sum(r["outcome"] in SEARCHED for r in mine),
            "answer_rate": _rate(
                [
                    r["answered"]
                    for r in mine
                    if r["kind"] in MEMORY_CLASSES and r["answered"] is not None
                ]
            ),
            "by_slice": {k: {"n": len(v), **_class_rates(v)} for k, v in sorted(slices.items())},
            "inconsistent": sum(r["logged_hit"] == r["quiet"] for r in mine),
        }
    on, off = out["modes"]["on"], out["modes"]["off"]
    out["added_ms_per_turn"] = round(on["mean_ms"] - off["mean_ms"], 2)
    out["added_ms_by_class"] = _added_by_class(by_mode["on"], by_mode["off"])
    out["series"] = {
        "latency_ms": {m: [r["ms"] for r in v] for m, v in by_mode.items()},
        "outcome_ms": {m: [[r["outcome"], r["ms"]] for r in v] for m, v in by_mode.items()},
        "cumulative_tokens": {m: cumulative_by_turn(v) for m, v in by_mode.items()},
    }
    return out


def _added_by_class(on: list[dict[str, Any]], off: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for kind in sorted({r["kind"] for r in on}):
        a = [r["ms"] for r in on if r["kind"] == kind]
        b = [r["ms"] for r in off if r["kind"] == kind]
        if a and b:
            out[kind] = round(statistics.fmean(a) - statistics.fmean(b), 2)
    return out


def cumulative_by_turn(rows: list[dict[str, Any]]) -> list[float]:
    """Mean, over conversations, of the input tokens that recall has added up to turn t
    (the sum over turns 1..t of everything injected so far). A conversation shorter than t
    counts at its total, so the last point is the table's `tokens_cumulative` (averaged
    over only the conversations still going, the curve ended above it: QA)."""
    per_conv: dict[str, list[int]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["conversation"], r["turn"])):
        per_conv[r["conversation"]].append(r["tokens"])
    longest = max((len(v) for v in per_conv.values()), default=0)
    out = []
    for t in range(longest):
        values = []
        for series in per_conv.values():
            upto = min(t, len(series) - 1)
            values.append(sum(sum(series[: s + 1]) for s in range(upto + 1)))
        out.append(round(statistics.fmean(values), 1))
    return out


def render(result: dict[str, Any], more: dict[str, Any], deadline_ms: int) -> str:
    """The figures as a short text table."""
    lines = [f"{result['conversations']} conversations, {result['turns']} turns per mode"]
    lines.append(
        f"{'mode':<9}{'p50':>7}{'p95':>7}{'p99':>7}{'max':>7} {'tok/turn':>9}{'cumul.':>9}"
        f"{'dup':>6}{'useful':>8}{'quiet':>7}"
    )
    for mode in MODES:
        r, e = result[mode], more["modes"][mode]
        h = r["hook_ms"]
        lines.append(
            f"{mode:<9}{h['p50']:>7.0f}{h['p95']:>7.0f}{h['p99']:>7.0f}{e['max_ms']:>7.0f} "
            f"{r['tokens_per_turn']:>9.1f}{r['tokens_cumulative']:>9.0f}{r['duplicate_rate']:>6.2f}"
            f"{_fmt(r['useful_rate']):>8}{_fmt(r['quiet_rate']):>7}"
        )
    on = more["modes"]["on"]
    lines.append(
        f"on: {on['over_deadline']} prompts over {deadline_ms} + {ON_TIME_SLACK_MS} ms; "
        f"added {more['added_ms_per_turn']:+.1f} ms per turn versus off; outcomes "
        + ", ".join(f"{k} {v}" for k, v in result["on"]["outcomes"].items() if v)
    )
    for late in on["late_turns"]:
        phases = ", ".join(f"{k} {v:.0f}" for k, v in late["hook_phases_ms"].items())
        lines.append(
            f"  late: {late['conversation']} turn {late['turn']}, {late['ms']:.0f} ms, "
            f"{late['outcome']} ({late['reason'] or '-'}); hook's clock: {phases or 'no log'}"
        )
    lines.append(f"{'class':<18}" + "".join(f"{m + ' use/quiet':>20}" for m in MODES))
    for kind in sorted(result["on"]["by_class"]):
        cells = []
        for mode in MODES:
            c = result[mode]["by_class"].get(kind, {})
            cells.append(f"{_fmt(c.get('useful_rate')) + ' / ' + _fmt(c.get('quiet_rate')):>20}")
        lines.append(f"{kind:<18}" + "".join(cells))
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
