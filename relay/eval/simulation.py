"""The hook's decisions re-run offline over replayed conversations, for the advice.

`simulate` plays every turn of every conversation through the hook's own gate, ledger and
packer under one setting of the knobs, each prompt's search answered by what the real server
returned for it (`Probes`). The advice tries thousands of settings (`advice.GRID`), and many
of them act alike on a conversation: `Simulator` plays each conversation once per distinct
effect of a setting and reuses the result for the others.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from relay.eval.conversations import (
    MEMORY_CLASSES,
    QUIET_CLASSES,
    Conversation,
    kept_in_history,
)
from relay.hook import config as hook_config
from relay.hook import gate, state
from relay.hook.pack import PROMPT_INTRO, PROMPT_REMINDER, ledger_add, pack, tokens
from relay.hook.run import QUERY_MAX_CHARS

# (store, query) -> the validated results the server gave that prompt
Probes = dict[tuple[str, str], list[dict[str, Any]]]
SEARCH_COST = 0.1  # score lost per prompt that searches


@dataclass
class Played:
    """One conversation played under one setting."""

    useful: list[bool] = field(default_factory=list)  # per memory prompt with gold: got one
    quiet: list[bool] = field(default_factory=list)  # per quiet-class prompt: nothing injected
    searched: int = 0
    tokens: int = 0  # cumulative input tokens the injections cost (kept_in_history)
    per_class: dict[str, list[int]] = field(default_factory=dict)  # [turns, searched, injected]


class Simulator:
    """`simulate` for many settings over the same probes.

    A conversation's play depends on a setting only through which of its prompts are too
    short (min_prompt_len), which of each prompt's results clear min_score, and the other
    knobs as they are. Both thresholds cut nested sets (a higher one keeps a subset), so the
    count each keeps names the set, and the play is reused for every setting with the same
    counts."""

    def __init__(self, probes: Probes) -> None:
        self.probes = probes
        self.plays: dict[tuple[Any, ...], Played] = {}
        self.words: dict[str, list[str]] = {}  # prompt -> gate.keywords(prompt): read only
        # conversation id -> its prompts, their lengths and each one's result scores, sorted
        self.shapes: dict[str, tuple[list[str], list[int], list[list[float]]]] = {}

    def __call__(self, conversations: list[Conversation], knobs: dict[str, Any]) -> dict[str, Any]:
        """The hook's decisions for every turn under `knobs`; usefulness, quiet, searches,
        tokens (as `simulate`)."""
        cfg = hook_config.Config(knobs)
        return figures([self.play(conv, cfg) for conv in conversations], len(conversations))

    def results(self, conv: Conversation, prompt: str) -> list[dict[str, Any]]:
        return self.probes.get((conv.store, prompt[:QUERY_MAX_CHARS]), [])

    def play(self, conv: Conversation, cfg: hook_config.Config) -> Played:
        if conv.id not in self.shapes:
            prompts = [turn.prompt.strip() for turn in conv.turns]
            scores = [sorted(r["score"] or 0.0 for r in self.results(conv, p)) for p in prompts]
            self.shapes[conv.id] = (prompts, sorted(len(p) for p in prompts), scores)
        prompts, lengths, scores = self.shapes[conv.id]
        min_score = cfg.min_score
        key = (
            conv.id,
            bisect.bisect_left(lengths, cfg.min_prompt_len),  # prompts too short to search
            tuple(bisect.bisect_left(s, min_score) for s in scores),  # results below min_score
            cfg.throttle_prompts,
            cfg.overlap_threshold,
            cfg.max_records,
            cfg.max_tokens,
        )
        if key not in self.plays:
            self.plays[key] = self._play(conv, prompts, cfg)
        return self.plays[key]

    def _play(self, conv: Conversation, prompts: list[str], cfg: hook_config.Config) -> Played:
        out = Played()
        data = state.fresh(conv.id)
        held: set[str] = set()
        length = len(conv.turns)
        for turn, prompt in zip(conv.turns, prompts, strict=True):
            if prompt not in self.words:
                self.words[prompt] = gate.keywords(prompt)
            words = self.words[prompt]
            data["count"] += 1
            context = None
            did_search = gate.skip_reason(prompt, words, data, cfg) is None
            if did_search:
                out.searched += 1
                records = [
                    r for r in self.results(conv, prompt) if (r["score"] or 0.0) >= cfg.min_score
                ]
                context, injected, _ = pack(
                    records,
                    data["ledger"],
                    cfg.max_records,
                    cfg.max_tokens,
                    PROMPT_INTRO,
                    PROMPT_REMINDER,
                    shown=data["shown"],
                )
                data["keywords"] = words
                if context is not None:  # as the hook: a search that injected nothing
                    data["last_search"] = data["count"]  # starts no throttle
                for record in injected:
                    ledger_add(data["ledger"], record, data["shown"])
                    held.add(record["id"])
                if context:
                    out.tokens += kept_in_history(tokens(context), turn.no, length)
            counts = out.per_class.setdefault(turn.kind, [0, 0, 0])
            counts[0] += 1
            counts[1] += did_search
            counts[2] += context is not None
            if turn.kind in MEMORY_CLASSES and turn.relevant:
                out.useful.append(any(g in held for g in turn.relevant))
            if turn.kind in QUIET_CLASSES:
                out.quiet.append(context is None)
        return out


def figures(played: list[Played], conversations: int) -> dict[str, Any]:
    """What `simulate` reports for conversations played under one setting."""
    useful = [u for p in played for u in p.useful]
    quiet = [q for p in played for q in p.quiet]
    searched = sum(p.searched for p in played)
    per_class: dict[str, list[int]] = {}
    for p in played:
        for kind, counts in p.per_class.items():
            total = per_class.setdefault(kind, [0, 0, 0])
            for i, n in enumerate(counts):
                total[i] += n
    turns = sum(v[0] for v in per_class.values())
    useful_rate = sum(useful) / len(useful) if useful else 0.0
    quiet_rate = sum(quiet) / len(quiet) if quiet else 0.0
    return {
        "useful_rate": round(useful_rate, 4),
        "quiet_rate": round(quiet_rate, 4),
        "search_share": round(searched / turns, 4) if turns else 0.0,
        "tokens_cumulative": round(sum(p.tokens for p in played) / max(conversations, 1), 1),
        "searched_by_class": {k: round(v[1] / v[0], 4) for k, v in sorted(per_class.items())},
        "injected_by_class": {k: round(v[2] / v[0], 4) for k, v in sorted(per_class.items())},
        "score": round(useful_rate + quiet_rate - SEARCH_COST * searched / max(turns, 1), 4),
    }


def simulate(
    conversations: list[Conversation], probes: Probes, knobs: dict[str, Any]
) -> dict[str, Any]:
    """The hook's decisions for every turn under `knobs`; usefulness, quiet, searches, tokens."""
    return Simulator(probes)(conversations, knobs)
