"""Settings a team can adopt, from its own replay: which prompt classes recall slows down
without helping, and the gate knobs and relevance threshold that serve its memories best.

The knobs are chosen by re-running the hook's own decisions offline (its gate,
its ledger and its packer, imported from `relay.hook`) over the replayed
conversations, with each prompt's search answered by what the real server
returned for it (one probe per distinct prompt, after the timed replay).
The chosen setting is the most useful one that meets the issue's other targets (at
least 0.9 of nothing-needed prompts quiet, cumulative tokens at most a third of the
ungated run) on the whole replay and on each half of its conversations (odd, even): a
setting that meets them only on the whole fits these particular conversations, and the
advice is for the team's next ones. When none does, the one scoring best on useful_rate +
quiet_rate - 0.1 x (share of prompts that search): a search nobody needed costs the prompt
its wait.
`--apply` writes the chosen knobs into the Relay config (docs/hook.md).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relay.errors import InvalidRequestError, RelayError
from relay.eval.conversations import (
    MEMORY_CLASSES,
    QUIET_CLASSES,
    Conversation,
    kept_in_history,
)
from relay.eval.simulation import Probes, Simulator, simulate
from relay.hook import config as hook_config
from relay.hook.pack import validate
from relay.hook.run import QUERY_MAX_CHARS, results_wanted
from relay.hook_stats import SEARCHED

KNOBS = ("min_prompt_len", "throttle_prompts", "overlap_threshold", "min_score", "max_records")
GRID = {
    "min_prompt_len": (15, 20, 25, 30, 40),
    "throttle_prompts": (0, 1, 2, 3),
    "overlap_threshold": (0.2, 0.3, 0.4, 0.5),
    "min_score": (0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
    + (0.55, 0.6, 0.65, 0.7, 0.75, 0.8),
    # Fewer records per hit leave tokens for hits on more prompts, and short memories leave room
    # under max_tokens for more of them: the token target decides which serves a team better.
    "max_records": (1, 2, 3, 4, 5),
}
# The targets, which the report judges the replay by and the advice its setting by.
USEFUL_TARGET = 0.8  # of memory-needing prompts with gold have it in context
QUIET_TARGET = 0.9  # of nothing-needed prompts get nothing
TOKEN_TARGET = 1 / 3  # of the ungated cumulative tokens, at most
# Labelled prompts on each side the advice needs: with fewer, one prompt moves a rate by
# more than the quiet target's margin (0.1), and a setting fitted to them fits noise.
MIN_LABELLED = round(1 / (1 - QUIET_TARGET))
NO_HELP = 0.1  # a class whose searches bring a gold memory less often than this does not help
# ... and is worth excluding only if it searches at all often (1 of 50 prompts is noise).
MIN_SEARCHED_SHARE = 0.05


def labelled(conversations: list[Conversation]) -> tuple[int, int]:
    """(prompts that name the memories they need, prompts that need nothing)."""
    turns = [t for c in conversations for t in c.turns]
    return (
        sum(t.kind in MEMORY_CLASSES and bool(t.relevant) for t in turns),
        sum(t.kind in QUIET_CLASSES for t in turns),
    )


LABEL_HINT = " (label the prompts: docs/eval.md)"


def cannot_advise(conversations: list[Conversation]) -> str | None:
    """Why these prompts cannot judge a setting, or None. The advice trades prompts that need
    a memory (and name it) against prompts that need nothing; with either side missing, it
    would fit the other alone: silence everything, or inject on every prompt. With too few
    on a side (MIN_LABELLED) it fits a prompt or two: five rows advised cutting usefulness
    from 1.00 to 0.50, one prompt of two, to meet the token target."""
    needing, quiet = labelled(conversations)
    if not needing:
        return (
            "no prompt names the memories it needs (a needs_memory or topic_shift row with "
            "'relevant' ids), so whether recall helps cannot be judged" + LABEL_HINT
        )
    if not quiet:
        return (
            "no prompt is labelled follow_up or nothing_relevant, so whether recall keeps "
            "quiet when nothing is needed cannot be judged" + LABEL_HINT
        )
    if min(needing, quiet) < MIN_LABELLED:
        return (
            f"too few labelled prompts to advise on: {needing} name the memories they need "
            f"(needs_memory or topic_shift with 'relevant' ids) and {quiet} need nothing "
            f"(follow_up or nothing_relevant); the advice needs at least {MIN_LABELLED} of "
            f"each, so that one prompt moves a rate by at most {1 / MIN_LABELLED:.1f}{LABEL_HINT}"
        )
    return None


def refused(reason: str, current: dict[str, Any]) -> dict[str, Any]:
    """The advice when `cannot_advise` gave a reason: the knobs as they are, and why."""
    return {"refused": reason, "current": {k: current[k] for k in KNOBS}}


def knob_environ(config: Path | None, installed: bool) -> dict[str, str]:
    """Where the replay's `on` mode takes its knobs, as the hook's variables: --config; else,
    for --apply, the hook as it runs now (the config --apply writes, beneath the knobs of the
    script `relay install` put beside it), so the advice starts from the user's own knobs and
    its changes are the ones it writes; else the defaults. Never the script's DEADLINE_MS:
    every mode runs at the replay's --deadline-ms, which over_deadline is judged by."""
    if config is not None:
        return {"RELAY_CONFIG": str(config)}
    if not installed:
        return {"RELAY_CONFIG": os.devnull}
    from relay.agents import SCRIPT_NAME
    from relay.knob_script import read_file

    path = Path(hook_config.config_path(os.environ))
    reading = read_file(path.with_name(SCRIPT_NAME))
    environ = reading.handed({"RELAY_CONFIG": str(path)}) if reading else {}
    environ.pop("RELAY_DEADLINE_MS", None)
    return {**environ, "RELAY_CONFIG": str(path)}


def current_knobs(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The knobs the replay's `on` mode ran with, read as the hook reads them from `environ`
    (`knob_environ`; None: the defaults)."""
    cfg = hook_config.load(environ or {"RELAY_CONFIG": os.devnull})
    return {k: cfg[k] for k in (*KNOBS, "max_tokens")}


def probe(
    conversations: list[Conversation],
    search: Callable[[str, dict[str, Any]], tuple[int, Any]],
    max_records: int = int(max(GRID["max_records"])),
) -> Probes:
    """What the server answers each distinct prompt, as the hook would validate it; as many
    results as the largest `max_records` tried needs. A search not answered 200 raises
    RelayError: taken for an empty answer, it would pass for "nothing relevant"."""
    out: Probes = {}
    for conv in conversations:
        for turn in conv.turns:
            query = turn.prompt.strip()[:QUERY_MAX_CHARS]
            if (conv.store, query) in out or not query:
                continue
            body = {"query": query, "k": results_wanted(max_records), "deadline_ms": 2000}
            status, payload = search(conv.store, body)
            if status != 200:
                raise RelayError(f"a search answered HTTP {status}")
            out[conv.store, query] = validate(payload)
    return out


def best_knobs(
    conversations: list[Conversation],
    probes: Probes,
    current: dict[str, Any],
    ungated_tokens: dict[str, float],
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The most useful of the grid's points and the current knobs that meets the quiet and
    token targets on the whole and on each half of the conversations (fewest searches, then
    nearest the current knobs); when none does, the one with the best score. The current
    knobs are a candidate as they stand: a team's own off-grid setting that already meets the
    targets is never traded for a less useful grid point. `ungated_tokens`: each
    conversation's cumulative tokens in the ungated run."""
    halves = [conversations[0::2], conversations[1::2]] if len(conversations) > 1 else []

    def meets(convs: list[Conversation], sim: dict[str, Any]) -> bool:
        ungated = sum(ungated_tokens.get(c.id, 0.0) for c in convs) / len(convs)
        return (
            sim["quiet_rate"] >= QUIET_TARGET and sim["tokens_cumulative"] <= ungated * TOKEN_TARGET
        )

    feasible: tuple[tuple[float, ...], dict[str, Any], dict[str, Any]] | None = None
    scored: tuple[tuple[float, ...], dict[str, Any], dict[str, Any]] | None = None
    own = tuple(current[k] for k in KNOBS)
    play = Simulator(probes)
    for values in itertools.chain([own], itertools.product(*(GRID[k] for k in KNOBS))):
        knobs = {**current, **dict(zip(KNOBS, values, strict=True))}
        sim = play(conversations, knobs)
        distance = sum(
            abs(knobs[k] - current[k]) / (max(GRID[k]) - min(GRID[k]) or 1) for k in KNOBS
        )
        key = (sim["useful_rate"], -sim["search_share"], -distance)
        if (
            (feasible is None or key > feasible[0])
            and meets(conversations, sim)
            and all(meets(h, play(h, knobs)) for h in halves)
        ):
            feasible = (key, knobs, sim)
        rank = (sim["score"], -distance)
        if scored is None or rank > scored[0]:
            scored = (rank, knobs, sim)
    if feasible is not None:
        rule = "most useful setting that meets the quiet and token targets, on each half too"
        useful = feasible[2]["useful_rate"]
        if useful < USEFUL_TARGET:
            # Honest about the trade: the report judges the replay by this target too.
            rule += f"; none of those reaches the usefulness target ({USEFUL_TARGET})"
            if useful < play(conversations, current)["useful_rate"]:
                rule += (
                    ", and this one is less useful than the current knobs: meeting the quiet "
                    "and token targets costs usefulness here"
                )
        return feasible[1], feasible[2], rule
    assert scored is not None
    return scored[1], scored[2], "no setting meets the quiet and token targets: best score"


def target_checks(sim: dict[str, Any], ungated_tokens: float) -> dict[str, dict[str, Any]]:
    """The issue's targets for one simulated setting: {target: {"value", "met"}}, on the
    whole replay (the advice also holds the quiet and token ones on each half)."""
    ratio = sim["tokens_cumulative"] / ungated_tokens if ungated_tokens else 0.0
    return {
        "useful_rate": {"value": sim["useful_rate"], "met": sim["useful_rate"] >= USEFUL_TARGET},
        "quiet_rate": {"value": sim["quiet_rate"], "met": sim["quiet_rate"] >= QUIET_TARGET},
        "tokens_of_ungated": {"value": round(ratio, 4), "met": ratio <= TOKEN_TARGET},
    }


TARGET_NAMES = {
    "useful_rate": f"usefulness ≥ {USEFUL_TARGET}",
    "quiet_rate": f"quiet ≥ {QUIET_TARGET}",
    "tokens_of_ungated": "cumulative tokens ≤ 1/3 of ungated",
}


def ungated_by_conversation(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each conversation's cumulative injected tokens in the ungated run."""
    out: dict[str, float] = {}
    for r in rows:
        if r["mode"] == "ungated":
            spent = kept_in_history(r["tokens"], r["turn"], r["turns"])
            out[r["conversation"]] = out.get(r["conversation"], 0.0) + spent
    return out


def class_costs(on: list[dict[str, Any]], off: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per prompt class: how often recall searched, what it added in time, how often a search
    brought a gold memory into context at that turn."""
    out = []
    for kind in sorted({r["kind"] for r in on}):
        mine = [r for r in on if r["kind"] == kind]
        base = [r["ms"] for r in off if r["kind"] == kind]
        searches = [r for r in mine if r["outcome"] in SEARCHED]
        helped = sum(bool(r.get("gold_injected")) for r in searches)
        added = (
            sum(r["ms"] for r in mine) / len(mine) - sum(base) / len(base) if mine and base else 0.0
        )
        out.append(
            {
                "class": kind,
                "turns": len(mine),
                "searched": len(searches),
                "helped": helped,
                "injected": sum(not r["quiet"] for r in mine),
                "added_ms": round(added, 1),
            }
        )
    return out


# Classes the hook can tell apart before it searches, and the knob that does it. A prompt for
# which nothing relevant exists cannot be: only the relevance threshold keeps it quiet.
EXCLUDING_KNOB = {"follow_up": "min_prompt_len", "same_topic": "overlap_threshold"}


def worth_excluding(cost: dict[str, Any]) -> bool:
    """A class the gate can recognise that searches often enough and almost never helps."""
    return (
        cost["class"] in EXCLUDING_KNOB
        and cost["searched"] > 0
        and cost["searched"] >= MIN_SEARCHED_SHARE * cost["turns"]
        and cost["helped"] / cost["searched"] < NO_HELP
    )


def moved_by(
    conversations: list[Conversation],
    probes: Probes,
    current: dict[str, Any],
    recommended: dict[str, Any],
    kind: str,
) -> dict[str, list[Any]]:
    """The advised changes that move how often `kind` searches or injects ({knob: [now,
    advised]}), each tried alone on the current knobs; all of them when they do it only
    together, none when the class comes out as it was. The knob that recognises a class
    is not always the one that moves it: a new throttle changes which prompt searched
    last, and so what the overlap gate compares a same-topic prompt with."""
    changed = {k: [current[k], recommended[k]] for k in KNOBS if recommended[k] != current[k]}

    def shares(knobs: dict[str, Any]) -> tuple[float, float]:
        sim = simulate(conversations, probes, knobs)
        return sim["searched_by_class"].get(kind, 0.0), sim["injected_by_class"].get(kind, 0.0)

    before = shares(current)
    if shares(recommended) == before:
        return {}
    alone = {k: v for k, v in changed.items() if shares({**current, k: v[1]}) != before}
    return alone or changed


def class_advice(
    conversations: list[Conversation],
    probes: Probes,
    current: dict[str, Any],
    recommended: dict[str, Any],
    cost: dict[str, Any],
    knob: str,
) -> dict[str, Any]:
    """One class's cost, the knob that can keep it quiet (now and advised), and the advice's
    predicted effect on it, credited to the advised changes that make it (`moved_by`)."""
    kind = cost["class"]
    now = simulate(conversations, probes, current)
    advised = simulate(conversations, probes, recommended)
    return {
        **cost,
        "knob": knob,
        "knob_now": current[knob],
        "knob_advised": recommended[knob],
        "moved_by": moved_by(conversations, probes, current, recommended, kind),
        "searched_now": now["searched_by_class"].get(kind, 0.0),
        "searched_advised": advised["searched_by_class"].get(kind, 0.0),
        "injected_now": now["injected_by_class"].get(kind, 0.0),
        "injected_advised": advised["injected_by_class"].get(kind, 0.0),
    }


def advise(
    conversations: list[Conversation],
    probes: Probes,
    rows: list[dict[str, Any]],
    current: dict[str, Any],
) -> dict[str, Any]:
    on = [r for r in rows if r["mode"] == "on"]
    off = [r for r in rows if r["mode"] == "off"]
    costs = class_costs(on, off)
    ungated = ungated_by_conversation(rows)
    recommended, predicted, rule = best_knobs(conversations, probes, current, ungated)
    baseline = simulate(conversations, probes, current)
    ungated_mean = sum(ungated.values()) / max(len(conversations), 1)
    exclude = [
        class_advice(conversations, probes, current, recommended, c, EXCLUDING_KNOB[c["class"]])
        for c in costs
        if worth_excluding(c)
    ]
    # A prompt for which nothing relevant exists is kept quiet by the relevance threshold
    # alone; the advice's effect on it may still come from other knobs (a lower throttle
    # lets it search), and is credited to those.
    threshold = next(
        (
            class_advice(conversations, probes, current, recommended, c, "min_score")
            for c in costs
            if c["class"] == "nothing_relevant"
        ),
        None,
    )
    needing, quiet = labelled(conversations)
    notes = [
        f"{c['class']}: {c['helped']} of {c['searched']} searches brought a gold memory; "
        "what misses here is retrieval, which no hook knob fixes"
        for c in costs
        if c["class"] in MEMORY_CLASSES and c["searched"] and c["helped"] / c["searched"] < 0.5
    ]
    changed = {k: recommended[k] for k in KNOBS if recommended[k] != current[k]}
    return {
        "current": {k: current[k] for k in KNOBS},
        "recommended": {k: recommended[k] for k in KNOBS},
        "changes": changed,
        "rule": rule,
        "sample": {
            "conversations": len(conversations),
            "memory_prompts": needing,
            "quiet_prompts": quiet,
        },
        "ungated_tokens_cumulative": round(ungated_mean, 1),
        "predicted_current": baseline,
        "predicted_recommended": predicted,
        "targets_current": target_checks(baseline, ungated_mean),
        "targets_recommended": target_checks(predicted, ungated_mean),
        "classes": costs,
        "exclude": exclude,
        "threshold": threshold,
        "notes": notes,
    }


def apply_target(environ: dict[str, str] | None = None) -> Path:
    """The config `apply` will write, checked before the replay whose advice it takes: one it
    could not read back (the hook would ignore it too) or cannot write is refused now, not
    after minutes of replay."""
    from relay.agents import SCRIPT_NAME

    path = Path(hook_config.config_path(os.environ if environ is None else environ))
    problem = hook_config.file_problem(str(path))
    if problem:
        raise InvalidRequestError(f"--apply: {problem}")
    for file in (path, path.with_name(SCRIPT_NAME)):
        target = Path(os.path.realpath(file))  # a symlink is written through to its target
        if file != path and not target.exists():
            continue  # no hook script: the config alone is written
        held = target if target.exists() else None
        folder = next(p for p in (target.parent, *target.parent.parents) if p.exists())
        if not os.access(folder, os.W_OK | os.X_OK) or (held and not os.access(held, os.W_OK)):
            raise InvalidRequestError(f"--apply: {file} cannot be written: fix its permissions")
    return path


def apply(settings: dict[str, Any], environ: dict[str, str] | None = None) -> list[Path]:
    """Merge `settings` into the Relay config file, keeping every other key, and into the
    knobs of the hook script `relay install` put beside it, whose values beat the config's;
    returns the files written. A symlinked config is written through to its target, which
    keeps its permissions (a new file is its owner's alone)."""
    from relay.agents import SCRIPT_NAME
    from relay.install_files import write_atomic
    from relay.knob_script import set_script_knobs

    path = apply_target(environ)
    existing: dict[str, Any] = {}
    if path.exists():
        existing = json.loads(path.read_text(encoding="utf-8-sig") or "{}")  # apply_target read it
    Path(os.path.realpath(path)).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, (json.dumps({**existing, **settings}, indent=2) + "\n").encode(), 0o600)
    script = path.with_name(SCRIPT_NAME)
    return [path, script] if set_script_knobs(script, settings) else [path]


def knob_and_effect(c: dict[str, Any], arrow: str = "->") -> tuple[str, str]:
    """A class entry's knob with its own change, and the advice's predicted effect on the
    class credited to the changes that make it (`moved_by`), not to that knob."""
    knob = (
        f"{c['knob']} {c['knob_now']} {arrow} {c['knob_advised']}"
        if c["knob_advised"] != c["knob_now"]
        else f"{c['knob']} stays {c['knob_now']}"
    )
    effect = (
        f"the advised {changes(c['moved_by'], arrow)} makes it search {c['searched_now']:.2f} "
        f"{arrow} {c['searched_advised']:.2f} and inject {c['injected_now']:.2f} {arrow} "
        f"{c['injected_advised']:.2f} of its prompts"
        if c["moved_by"]
        else f"the advised knobs leave it searching {c['searched_now']:.2f} and injecting "
        f"{c['injected_now']:.2f} of its prompts"
    )
    return knob, effect


def render_exclusions(entries: list[dict[str, Any]]) -> list[str]:
    """One line per class worth excluding (`worth_excluding`), with what the advice does."""
    lines = []
    for c in entries:
        # The advised knobs serve every class at once: say so when they let this one
        # search more, rather than advise excluding it in the same breath.
        verdict = (
            "the advised knobs still let it search more, for the other classes' sake"
            if c["searched_advised"] > c["searched_now"]
            else "exclude"
        )
        knob, effect = knob_and_effect(c)
        lines.append(
            f"  {c['class']} ({verdict}): {c['searched']} of {c['turns']} searched, "
            f"{c['helped']} brought a gold memory, {c['added_ms']:+.0f} ms per turn; "
            f"the gate's knob for it: {knob}; {effect}"
        )
    return lines


def render_threshold(t: dict[str, Any]) -> str:
    """The nothing_relevant line: its one knob, and what the advised changes do to it."""
    knob, effect = knob_and_effect(t)
    return (
        f"  {t['class']}: {t['injected']} of {t['turns']} got something injected; only the "
        f"relevance threshold can keep it quiet: {knob}; {effect}"
    )


def changes(moved: dict[str, list[Any]], arrow: str = "->") -> str:
    """'throttle_prompts 2 -> 0, min_score 0.1 -> 0.3'."""
    return ", ".join(f"{k} {now} {arrow} {new}" for k, (now, new) in moved.items())


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def render(advice: dict[str, Any], source: str) -> str:
    if advice.get("refused"):
        return f"no advice: {advice['refused']}"
    sample = advice["sample"]
    lines = [
        f"advice (fitted to the {sample['conversations']} conversations replayed from {source}, "
        f"{sample['memory_prompts']} prompts that need a memory and {sample['quiet_prompts']} "
        "that need nothing):"
    ]
    lines += render_exclusions(advice["exclude"])
    if not advice["exclude"]:
        lines.append("  no prompt class the gate can recognise searches without helping")
    if advice["threshold"]:
        lines.append(render_threshold(advice["threshold"]))
    now, new = advice["predicted_current"], advice["predicted_recommended"]
    lines.append(
        "  knobs: "
        + ", ".join(f"{k} {advice['current'][k]} -> {v}" for k, v in advice["changes"].items())
        if advice["changes"]
        else "  knobs: keep the current ones"
    )
    checks = [
        f"{TARGET_NAMES[k]} {advice['targets_current'][k]['value']:.2f} "
        f"{_met(advice['targets_current'][k]['met'])} -> {v['value']:.2f} {_met(v['met'])}"
        for k, v in advice["targets_recommended"].items()
    ]
    lines.append("  predicted targets, current -> advised: " + "; ".join(checks))
    lines.append(
        f"  predicted searching {now['search_share']:.2f} -> {new['search_share']:.2f} of prompts"
    )
    lines.append(
        f"  ({advice['rule']}; cumulative tokens {now['tokens_cumulative']:.0f} -> "
        f"{new['tokens_cumulative']:.0f}, ungated {advice['ungated_tokens_cumulative']:.0f})"
    )
    lines.extend(f"  note: {n}" for n in advice["notes"])
    return "\n".join(lines)
