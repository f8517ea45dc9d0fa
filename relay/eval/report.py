"""The report a team lead opens: one self-contained HTML file (inline SVG, no scripts, no
network) and the JSON behind it.

The plots are drawn here, in a few small functions: a histogram with marked
lines (latency with the deadline), grouped bars (outcomes, usefulness per class,
drills) and lines (cumulative tokens per turn).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from string import Template
from typing import Any

from relay.eval.advice import (
    QUIET_TARGET,
    TARGET_NAMES,
    TOKEN_TARGET,
    USEFUL_TARGET,
    changes,
    knob_and_effect,
)
from relay.eval.conversations import MEMORY_CLASSES, UNLABELLED
from relay.eval.replay import SERVER_FAILURES
from relay.hook_bench import ON_TIME_SLACK_MS

COLOURS = {"on": "#2f6fdf", "off": "#9aa5b4", "ungated": "#e0832f"}
# One colour per series of a plot, none repeated for up to ten (the fault drills draw nine
# latency lines): no red, which marks the deadline, and no pale grey, hard to see as a line.
PALETTE = (
    "#2f6fdf",
    "#e0832f",
    "#1a9e77",
    "#c2185b",
    "#7b61c9",
    "#8c564b",
    "#17a2b8",
    "#a4a61d",
    "#3d4757",
    "#e377c2",
)
W, H = 920, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 44


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _colour(name: str, i: int) -> str:
    return COLOURS.get(name, PALETTE[i % len(PALETTE)])


def _axis(value: float, most: int) -> tuple[float, int]:
    """A round step (1, 2, 2.5 or 5 times a power of ten) and how many of them, at most
    `most`, reach `value`: the axis runs to step x count and every tick is a round number
    (a top of 5000 cut in four put ticks at 1250 and 3750)."""
    if value <= 0:
        return 1 / most, most
    magnitude = 10 ** math.floor(math.log10(value / most))
    step = next(
        m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude * most >= value * (1 - 1e-9)
    )
    return step, max(1, math.ceil(value / step - 1e-9))


def _frame(
    kind: str, label_y: str, y_axis: tuple[float, int], caption: str, inner: list[str], n: int
) -> str:
    """Axes, y grid (`_axis`: step, count) and legend space around the marks; `n` marks
    drawn (for checks)."""
    step, count = y_axis
    parts = [
        f'<svg class="plot" data-plot="{kind}" data-marks="{n}" viewBox="0 0 {W} {H}" '
        f'width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="{_e(caption)}">'
    ]
    for i in range(count + 1):
        y = H - BOTTOM - (H - TOP - BOTTOM) * i / count
        parts.append(
            f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eef1f5"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_tick(step * i)}</text>'
        )
    parts.append(
        f'<text x="14" y="{TOP + (H - TOP - BOTTOM) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + (H - TOP - BOTTOM) / 2:.0f})">{_e(label_y)}</text>'
    )
    parts.extend(inner)
    parts.append(
        f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}" stroke="#5b6577"/>'
    )
    parts.append("</svg>")
    return f"<figure>{''.join(parts)}<figcaption>{_e(caption)}</figcaption></figure>"


def _tick(value: float) -> str:
    """An axis label, exact (3750 is "3.75k", never "3.8k"), float noise rounded away."""
    if value >= 1000:
        return f"{value / 1000:.10g}k"
    return f"{value:.10g}"


def _num(value: float) -> str:
    """A figure in a tooltip: whole numbers exact, fractions to two places."""
    return f"{value:.2f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"


def _legend(names: list[str]) -> list[str]:
    out = []
    x = LEFT
    for i, name in enumerate(names):
        out.append(
            f'<rect x="{x}" y="6" width="12" height="12" fill="{_colour(name, i)}"/>'
            f'<text x="{x + 16}" y="16">{_e(name)}</text>'
        )
        x += 20 + 7 * len(name)
    return out


def histogram(
    series: dict[str, list[float]], marks: list[tuple[float, str]], caption: str, bins: int = 46
) -> str:
    """Share of runs per time bin, one step line per series, vertical lines at `marks`."""
    values = [v for vs in series.values() for v in vs]
    x_step, x_count = _axis(max([*values, *(m for m, _ in marks), 1.0]) * 1.05, 5)
    x_max = x_step * x_count
    width = x_max / bins
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    shares = {}
    for name, vs in series.items():
        counts = [0] * bins
        for v in vs:
            counts[min(bins - 1, int(v / width))] += 1
        shares[name] = [c / len(vs) if vs else 0.0 for c in counts]
    y_axis = _axis(max((s for ss in shares.values() for s in ss), default=0.0), 4)
    y_max = y_axis[0] * y_axis[1]
    inner = _legend(list(series))
    n = 0
    for i, (name, ss) in enumerate(shares.items()):
        points = []
        for b, s in enumerate(ss):
            y = H - BOTTOM - plot_h * s / y_max
            points.append(f"{LEFT + plot_w * b / bins:.1f},{y:.1f}")
            points.append(f"{LEFT + plot_w * (b + 1) / bins:.1f},{y:.1f}")
            n += s > 0
        inner.append(
            f'<polyline fill="none" stroke="{_colour(name, i)}" stroke-width="2" '
            f'points="{" ".join(points)}"/>'
        )
    for m, (at, label) in enumerate(marks):
        x = LEFT + plot_w * at / x_max
        # every label but the last left of its line: "deadline 400 ms" right of it was struck
        # through by the +50 line, 50 ms further on
        side = 'text-anchor="end" ' if m < len(marks) - 1 else ""
        inner.append(
            f'<line class="mark" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}" '
            f'stroke="#c62828" stroke-dasharray="5 4"/>'
            f'<text {side}x="{x + (-4 if side else 4):.1f}" y="{TOP + 12 + 14 * m}" '
            f'fill="#c62828">{_e(label)}</text>'
        )
    for i in range(x_count + 1):
        x = LEFT + plot_w * i / x_count
        anchor = "end" if i == x_count else "middle"
        inner.append(
            f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="{anchor}">'
            f"{_tick(x_step * i)} ms</text>"
        )
    return _frame("latency", "share of prompts", y_axis, caption, inner, n)


def bars(
    groups: list[tuple[str, dict[str, float | None]]],
    series: list[str],
    label_y: str,
    caption: str,
    kind: str,
    y_max: float | None = None,
) -> str:
    """Grouped vertical bars: one group per label, one bar per series (None: no bar)."""
    values = [v for _, g in groups for v in g.values() if v is not None]
    y_axis = (y_max / 4, 4) if y_max else _axis(max(values, default=0.0), 4)
    top = y_axis[0] * y_axis[1]
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    slot = plot_w / max(len(groups), 1)
    bar_w = slot * 0.8 / max(len(series), 1)
    inner = _legend(series)
    n = 0
    for g, (label, group) in enumerate(groups):
        x0 = LEFT + slot * g + slot * 0.1
        for i, name in enumerate(series):
            value = group.get(name)
            if value is None:
                continue
            h = plot_h * min(value, top) / top
            x = x0 + bar_w * i
            n += value > 0
            inner.append(
                f'<rect x="{x:.1f}" y="{H - BOTTOM - h:.1f}" width="{bar_w - 2:.1f}" '
                f'height="{h:.1f}" fill="{_colour(name, i)}"><title>{_e(label)} {_e(name)}: '
                f"{_num(value)}</title></rect>"
            )
        inner.append(
            f'<text x="{x0 + slot * 0.4:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">'
            f"{_e(label)}</text>"
        )
    return _frame(kind, label_y, y_axis, caption, inner, n)


def lines(series: dict[str, list[float]], label_y: str, caption: str, kind: str) -> str:
    """One line per series over turns 1..n."""
    longest = max((len(v) for v in series.values()), default=0)
    y_axis = _axis(max((x for v in series.values() for x in v), default=0.0), 4)
    top = y_axis[0] * y_axis[1]
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    inner = _legend(list(series))
    n = 0
    for i, (name, values) in enumerate(series.items()):
        points = [
            f"{LEFT + plot_w * t / max(longest - 1, 1):.1f},{H - BOTTOM - plot_h * v / top:.1f}"
            for t, v in enumerate(values)
        ]
        n += sum(v > 0 for v in values)
        inner.append(
            f'<polyline fill="none" stroke="{_colour(name, i)}" stroke-width="2.5" '
            f'points="{" ".join(points)}"/>'
        )
    for t in range(longest):
        if longest <= 20 or t % 2 == 0:
            x = LEFT + plot_w * t / max(longest - 1, 1)
            inner.append(
                f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{t + 1}</text>'
            )
    inner.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{H - 6}" text-anchor="middle">turn</text>')
    return _frame(kind, label_y, y_axis, caption, inner, n)


# -- pages ------------------------------------------------------------------------------
def _page(title: str, body: list[str]) -> str:
    template = Template((Path(__file__).parent / "report.html").read_text(encoding="utf-8"))
    return template.substitute(title=_e(title), body="\n".join(body))


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _check(ok: bool | None) -> str:
    if ok is None:
        return '<span class="meta">not measured</span>'
    return '<span class="pass">met</span>' if ok else '<span class="fail">not met</span>'


def _at_least(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


def targets(result: dict[str, Any], more: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The issue's targets, each with the measured figure (None: the data cannot tell, e.g.
    usefulness when no prompt names the memories it needs, or any target of a replay whose
    server stopped answering part of the way: `unanswered`)."""
    on, ungated = result["on"], result["ungated"]
    outage = unanswered(result) > 0
    ratio = (
        on["tokens_cumulative"] / ungated["tokens_cumulative"]
        if ungated["tokens_cumulative"]
        else 0.0
    )
    over = more["modes"]["on"]["over_deadline"]
    measured = [
        ("duplicate rate 0", f"{on['duplicate_rate']:.4f}", on["duplicate_rate"] == 0),
        (f"no prompt over deadline + {ON_TIME_SLACK_MS} ms", f"{over} over", over == 0),
        (
            f"usefulness ≥ {USEFUL_TARGET} on memory-needing prompts",
            _rate(on["useful_rate"]),
            _at_least(on["useful_rate"], USEFUL_TARGET),
        ),
        (
            f"≥ {QUIET_TARGET} of nothing-needed prompts get nothing",
            _rate(on["quiet_rate"]),
            _at_least(on["quiet_rate"], QUIET_TARGET),
        ),
        ("cumulative tokens ≤ 1/3 of ungated", f"{ratio:.3f} of ungated", ratio <= TOKEN_TARGET),
    ]
    return [(name, figure, None if outage else ok) for name, figure, ok in measured]


def unanswered(result: dict[str, Any]) -> int:
    """Hook runs of the modes that search which the server failed (`relay eval replay`
    exits 1 for them): their turns read as quiet and not useful, so nothing is judged."""
    return sum(result[m]["outcomes"].get(o, 0) for m in ("on", "ungated") for o in SERVER_FAILURES)


def replay_page(report: dict[str, Any]) -> str:
    result, more, meta = report["figures"], report["extras"], report["meta"]
    deadline = meta["deadline_ms"]
    modes = ["on", "off", "ungated"]
    body = [
        f"<h1>Does recall help? {_e(meta['dataset'])}</h1>",
        f'<p class="meta">{result["conversations"]} conversations, {result["turns"]} turns, '
        f"replayed through the real hook against a real relay serve; deadline {deadline} ms; "
        f"commit {_e(meta['commit']['head'][:10])}"
        + (
            f" with uncommitted {_e(', '.join(meta['commit']['uncommitted']))}"
            if meta["commit"]["uncommitted"]
            else ""
        )
        + f"; load average {_e(meta['load_average'])}; {_e(meta['finished'])}</p>",
    ]
    cards = []
    for name, figure, ok in targets(result, more):
        verdict = "meta" if ok is None else "pass" if ok else "fail"
        cards.append(
            f'<div class="card">{_e(name)}<b class="{verdict}">{_e(figure)}</b>{_check(ok)}</div>'
        )
    body.append(
        '<p class="meta">The targets as measured in this replay, recall on with the knobs '
        "replayed; the advice below predicts them for the setting it advises.</p>"
    )
    if failed := unanswered(result):
        body.append(
            f'<p class="fail">{failed} hook runs got no answer from the server (it stopped '
            "answering part of the way): these figures measure that, not recall, so no target "
            "is judged. Replay once <code>relay doctor</code> finds the server well.</p>"
        )
    body.append(f'<div class="cards">{"".join(cards)}</div>')
    body.append("<h2>Hook wall time, spawn to exit</h2>")
    body.append(
        histogram(
            {m: more["series"]["latency_ms"][m] for m in modes},
            [
                (deadline, f"deadline {deadline} ms"),
                (deadline + ON_TIME_SLACK_MS, f"+{ON_TIME_SLACK_MS}"),
            ],
            "Distribution of hook wall time per prompt, by mode; dashed: the deadline and "
            "the deadline + 50 ms.",
        )
    )
    body.append(
        _table(
            ["mode", "p50 ms", "p95 ms", "p99 ms", "max ms", "over deadline+50", "mean ms"],
            [
                [
                    m,
                    result[m]["hook_ms"]["p50"],
                    result[m]["hook_ms"]["p95"],
                    result[m]["hook_ms"]["p99"],
                    more["modes"][m]["max_ms"],
                    more["modes"][m]["over_deadline"],
                    more["modes"][m]["mean_ms"],
                ]
                for m in modes
            ],
        )
    )
    body.append(
        f'<p class="note">Recall on adds {more["added_ms_per_turn"]:+.1f} ms per turn on average '
        "versus recall off (the same hook process with the kill switch). Per class: "
        + ", ".join(f"{_e(k)} {v:+.0f} ms" for k, v in more["added_ms_by_class"].items())
        + ".</p>"
    )
    per_outcome = more["modes"]["on"]["hook_ms_by_outcome"]
    body.append(
        _table(
            ["outcome (on)", "p50 ms", "p95 ms", "p99 ms"],
            [[o, p["p50"], p["p95"], p["p99"]] for o, p in per_outcome.items()],
        )
    )
    body.append("<h2>Outcomes</h2>")
    outcomes = [
        o for o in result["on"]["outcomes"] if any(result[m]["outcomes"].get(o) for m in modes)
    ]
    body.append(
        bars(
            [(o, {m: float(result[m]["outcomes"].get(o, 0)) for m in modes}) for o in outcomes],
            modes,
            "prompts",
            "What the hook did on each prompt, by mode (from its outcome log).",
            "outcomes",
        )
    )
    body.append("<h2>Injected tokens kept in history</h2>")
    body.append(
        lines(
            {
                "on": more["series"]["cumulative_tokens"]["on"],
                "ungated": more["series"]["cumulative_tokens"]["ungated"],
            },
            "cumulative input tokens",
            "Mean cumulative input tokens added by recall up to each turn (every injected token "
            "stays in history): with gating and dedupe (on) and without (ungated).",
            "tokens",
        )
    )
    body.append(
        _table(
            ["mode", "tokens per turn", "cumulative per conversation", "duplicate rate"],
            [
                [
                    m,
                    result[m]["tokens_per_turn"],
                    result[m]["tokens_cumulative"],
                    result[m]["duplicate_rate"],
                ]
                for m in modes
            ],
        )
    )
    body.append("<h2>Usefulness per prompt class</h2>")
    classes = sorted(result["on"]["by_class"])
    groups = []
    for c in classes:
        if c == UNLABELLED:  # no rate to draw: nobody said what it needed
            continue
        key = "useful_rate" if c in MEMORY_CLASSES or c == "same_topic" else "quiet_rate"
        groups.append(
            (
                f"{c} ({'useful' if key == 'useful_rate' else 'quiet'})",
                {m: result[m]["by_class"].get(c, {}).get(key) for m in modes},
            )
        )
    if any(v is not None for _, group in groups for v in group.values()):
        body.append(
            bars(
                groups,
                modes,
                "share of prompts",
                "Memory-needing and same-topic classes: share whose context held a gold memory. "
                "Follow-ups and nothing-relevant: share that got nothing.",
                "usefulness",
                y_max=1.0,
            )
        )
    else:  # an empty frame of axes read as every rate at 0 (QA: a team's unlabelled prompts)
        body.append(
            '<p class="note">No class has a rate to draw: no prompt names the memories it '
            "needs ('relevant') or is labelled follow_up or nothing_relevant; label the prompts "
            "(docs/eval.md).</p>"
        )
    body.append(
        _table(
            [
                "class",
                "turns",
                *[f"{m} useful" for m in modes],
                *[f"{m} quiet" for m in modes],
                "on tokens/turn",
            ],
            [
                [
                    c,
                    sum(result["on"]["by_class"][c]["outcomes"].values()),
                    *[_rate(result[m]["by_class"].get(c, {}).get("useful_rate")) for m in modes],
                    *[_rate(result[m]["by_class"].get(c, {}).get("quiet_rate")) for m in modes],
                    result["on"]["by_class"][c]["tokens_per_turn"],
                ]
                for c in classes
            ],
        )
    )
    answer = more["modes"]["on"]["answer_rate"]
    if answer is not None:
        body.append(
            f'<p class="note">Where the data gives an answer, the injected context contained its '
            f"text for {answer:.2f} of memory-needing prompts (on).</p>"
        )
    if report.get("advice"):
        body.extend(_advice_html(report["advice"]))
    return _page(f"Relay replay: {meta['dataset']}", body)


def _advice_html(advice: dict[str, Any]) -> list[str]:
    out = ["<h2>Advice</h2>"]
    if advice.get("refused"):
        return [
            *out,
            f"<p>No advice: {_e(advice['refused'])}.</p>",
        ]
    if advice["exclude"]:
        out.append(
            _table(
                [
                    "class to exclude",
                    "turns",
                    "searched",
                    "brought gold",
                    "added ms",
                    "the gate's knob for it (now → advised)",
                    "advised changes that move it",
                    "searches (now → advised)",
                    "injects (now → advised)",
                ],
                [
                    [
                        c["class"],
                        c["turns"],
                        c["searched"],
                        c["helped"],
                        c["added_ms"],
                        knob_and_effect(c, "→")[0],
                        changes(c["moved_by"], "→") or "none",
                        f"{c['searched_now']:.2f} → {c['searched_advised']:.2f}",
                        f"{c['injected_now']:.2f} → {c['injected_advised']:.2f}",
                    ]
                    for c in advice["exclude"]
                ],
            )
        )
    else:
        out.append("<p>No prompt class the gate can recognise searches without helping.</p>")
    t = advice.get("threshold")
    if t:
        knob, effect = knob_and_effect(t, "→")
        out.append(
            f'<p class="note">Prompts for which nothing relevant exists cannot be recognised '
            f"before searching; only the relevance threshold can keep them quiet. "
            f"{t['injected']} of {t['turns']} got something injected. The relevance "
            f"threshold: {_e(knob)}; {_e(effect)}.</p>"
        )
    now, new = advice["predicted_current"], advice["predicted_recommended"]
    out.append(
        _table(
            ["setting", "current", "recommended"],
            [[k, advice["current"][k], advice["recommended"][k]] for k in advice["current"]],
        )
    )
    checks_now, checks_new = advice["targets_current"], advice["targets_recommended"]
    rows: list[list[object]] = [
        [
            TARGET_NAMES[k],
            f"{checks_now[k]['value']:.2f} {'met' if checks_now[k]['met'] else 'not met'}",
            f"{v['value']:.2f} {'met' if v['met'] else 'not met'}",
        ]
        for k, v in checks_new.items()
    ]
    rows += [[k, now[k], new[k]] for k in ("search_share", "tokens_cumulative")]
    out.append(
        _table(["predicted (hook decisions replayed offline)", "current", "recommended"], rows)
    )
    sample = advice["sample"]
    out.append(
        f'<p class="note">Chosen: {_e(advice["rule"])}. Fitted to the '
        f"{sample['conversations']} conversations replayed ({sample['memory_prompts']} prompts "
        f"that need a memory, {sample['quiet_prompts']} that need nothing).</p>"
    )
    for note in advice["notes"]:
        out.append(f'<p class="note">{_e(note)}</p>')
    return out


def faults_page(report: dict[str, Any]) -> str:
    drills, meta = report["drills"], report["meta"]
    deadline = meta["deadline_ms"]
    body = [
        f"<h1>Fault drills: {_e(meta['dataset'])}</h1>",
        '<p class="meta">The replay through the real hook while things break; '
        f"deadline {deadline} ms; "
        f"commit {_e(meta['commit']['head'][:10])}; load average {_e(meta['load_average'])}; "
        f"{_e(meta['finished'])}</p>",
        bars(
            [
                (
                    kind,
                    {
                        "on time": d["on_time"] / d["turns"] if d["turns"] else 0.0,
                        "logged correctly": d["logged_correctly"] / d["turns"]
                        if d["turns"]
                        else 0.0,
                        "injected from failure": d["injected_from_failure"] / d["turns"]
                        if d["turns"]
                        else 0.0,
                    },
                )
                for kind, d in drills.items()
            ],
            ["on time", "logged correctly", "injected from failure"],
            "share of turns",
            "Per drill: turns within the deadline + 50 ms, turns whose log names what happened, "
            "and turns that injected something from a failure (should be none).",
            "drills",
            y_max=1.0,
        ),
        histogram(
            {kind: d["ms"] for kind, d in report["series"].items()},
            [
                (deadline, f"deadline {deadline} ms"),
                (deadline + ON_TIME_SLACK_MS, f"+{ON_TIME_SLACK_MS}"),
            ],
            "Hook wall time per drill run, spawn to exit.",
        ),
        _table(
            [
                "drill",
                "turns",
                "on time",
                "injected from failure",
                "logged correctly",
                "max ms",
                "outcomes",
                "notes",
            ],
            [
                [
                    kind,
                    d["turns"],
                    d["on_time"],
                    d["injected_from_failure"],
                    d["logged_correctly"],
                    d["max_ms"],
                    ", ".join(f"{k} {v}" for k, v in sorted(d["outcomes"].items())),
                    ", ".join(
                        f"{k} {v}"
                        for k, v in d.items()
                        if k
                        in (
                            "exercised",
                            "expected",
                            "faulted_requests",
                            "deleted",
                            "warm_cache_hits",
                            "served_before_revocation",
                            "needed_after_compaction",
                            "returned_after_compaction",
                            "duplicate_injections",
                            "restart_s",
                        )
                    ),
                ]
                for kind, d in drills.items()
            ],
        ),
    ]
    problems = [f"{kind}: {p}" for kind, d in drills.items() for p in d["problems"]]
    if problems:
        body.append(
            "<h2>Runs that missed</h2>" + "".join(f'<p class="note">{_e(p)}</p>' for p in problems)
        )
    return _page(f"Relay fault drills: {meta['dataset']}", body)


def write(directory: Path, name: str, report: dict[str, Any], page: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{name}.json"
    html_path = directory / f"{name}.html"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    html_path.write_text(page, encoding="utf-8")
    return html_path, json_path
