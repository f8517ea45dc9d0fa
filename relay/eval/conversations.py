"""Conversations to replay: a bench folder's sessions, ones built from its questions, or JSONL.

A conversation is a list of turns, each a prompt with its class:
  needs_memory      a remembered fact changes the answer (gold ids in `relevant`)
  topic_shift       the same, moving the conversation to a new area
  same_topic        already answered by what an earlier prompt put in context
  follow_up         "continue", "ok, do it": nothing new should be injected
  nothing_relevant  a substantive prompt no memory covers
  unlabelled        a team's prompt with neither a class nor gold: its latency, outcome
                    and tokens count, but whether recall helped it cannot be judged
`coding_prompts` carries these classes and its sessions (`meta.session`, `meta.turn`).
For question sets without sessions (`locomo_observations`) `build_conversations`
mixes them into 20-turn conversations, deterministically for a seed: needs-memory
questions grouped by the session their gold comes from (a new group is a topic
shift), later questions whose gold is a subset of an earlier one's (same topic),
follow-ups, and the folder's empty-gold questions (nothing relevant).
A team's JSONL of prompts is replayed as written (`from_prompts`): nothing is added or
repeated, since padding a team's prompts with copies of themselves measures nothing real.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLASSES = ("needs_memory", "topic_shift", "same_topic", "follow_up", "nothing_relevant")
MEMORY_CLASSES = ("needs_memory", "topic_shift")  # useful_rate: did the context hold a gold memory
QUIET_CLASSES = ("follow_up", "nothing_relevant")  # quiet_rate: did they get nothing
UNLABELLED = "unlabelled"  # a team row with no kind and no gold: in no rate
TURNS_PER_CONVERSATION = 20

# The class of each of the 20 turns of a built conversation: three topics, the
# shares of coding_prompts (needs 35%, shift 11%, same topic 15%, follow-up 20%, nothing 19%).
PLAN = (
    ("needs_memory", "follow_up", "needs_memory", "same_topic", "nothing_relevant", "follow_up"),
    ("topic_shift", "needs_memory", "nothing_relevant", "same_topic", "needs_memory", "follow_up"),
    ("topic_shift", "needs_memory", "same_topic", "nothing_relevant", "needs_memory", "follow_up"),
    ("nothing_relevant", "needs_memory"),
)
FOLLOW_UPS = (
    "continue",
    "ok, do it",
    "go ahead",
    "yes please",
    "sounds good, keep going",
    "ok do that then",
    "thanks, carry on with the rest",
    "looks right to me, go on",
    "fine, next one",
    "great, continue from there",
    "yep",
    "keep going",
)


def kept_in_history(tokens: int, turn: int, turns: int) -> int:
    """What `tokens` injected at turn `turn` of `turns` cost in input over the conversation:
    they stay in its history for turns turn..turns."""
    return tokens * (turns - turn + 1)


@dataclass(frozen=True)
class Turn:
    conversation: str
    no: int  # 1-based position in the conversation
    prompt: str
    kind: str  # prompt class
    relevant: tuple[str, ...] = ()
    answer: str | None = None
    store: str = ""
    source_kind: str | None = None  # the data's own slice (temporal, adversarial, ...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation,
            "turn": self.no,
            "prompt": self.prompt,
            "kind": self.kind,
            "relevant": list(self.relevant),
            "answer": self.answer,
            "store": self.store,
            "source_kind": self.source_kind,
        }


@dataclass(frozen=True)
class Conversation:
    id: str
    store: str
    turns: tuple[Turn, ...]


def _answer(meta: dict[str, Any]) -> str | None:
    answer = meta.get("answer")
    return None if answer is None or answer == "" else str(answer)


def _usable(row: dict[str, Any]) -> bool:
    meta = row.get("meta") or {}
    return not meta.get("unscorable") and not meta.get("exclude_recommended")


def has_sessions(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and all((r.get("meta") or {}).get("session") is not None for r in rows)


def from_sessions(rows: Iterable[dict[str, Any]]) -> list[Conversation]:
    """One conversation per (store, meta.session), turns in meta.turn order."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        meta = row.get("meta") or {}
        if meta.get("unscorable"):
            continue
        grouped[(row.get("store") or "team", str(meta["session"]))].append(row)
    out = []
    for (store, session), items in sorted(grouped.items()):
        items.sort(key=lambda r: (r.get("meta") or {}).get("turn", 0))
        cid = f"{store}/{session}"
        turns = tuple(_turn(cid, i, r, store) for i, r in enumerate(items, 1))
        out.append(Conversation(cid, store, turns))
    return out


def from_prompts(rows: list[dict[str, Any]]) -> list[Conversation]:
    """A team's prompts as written: rows with a session replay as that session, in turn
    order; a row without one is a conversation of its own (no context is invented for it)."""
    in_sessions = [r for r in rows if r["meta"].get("session") is not None]
    alone = [
        Conversation(
            f"{r['store']}/{r['qid']}",
            r["store"],
            (_turn(f"{r['store']}/{r['qid']}", 1, r, r["store"]),),
        )
        for r in rows
        if r["meta"].get("session") is None
    ]
    return from_sessions(in_sessions) + alone


def _turn(cid: str, no: int, row: dict[str, Any], store: str) -> Turn:
    return Turn(
        conversation=cid,
        no=no,
        prompt=row.get("query") or row.get("prompt") or "",
        kind=row.get("kind") or _default_kind(row),
        relevant=tuple(row.get("relevant") or ()),
        answer=_answer(row.get("meta") or {}),
        store=store,
        source_kind=row.get("kind"),
    )


def _default_kind(row: dict[str, Any]) -> str:
    """A row that names gold needs memory; one with neither class nor gold is unlabelled
    (calling it nothing_relevant would score, and advise on, a guess)."""
    return "needs_memory" if row.get("relevant") else UNLABELLED


def _topic(row: dict[str, Any]) -> str:
    """The data session a question's first gold memory comes from ("S3:Caroline:1" -> "S3")."""
    return row["relevant"][0].split(":", 1)[0]


class _StorePool:
    """One store's questions, drawn without replacement where possible."""

    def __init__(self, rows: list[dict[str, Any]], rng: random.Random) -> None:
        self.rng = rng
        answerable = [r for r in rows if r.get("answerable", True) and r.get("relevant")]
        self.empty = [r for r in rows if not r.get("answerable", True) or not r.get("relevant")]
        self.by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in answerable:
            self.by_topic[_topic(row)].append(row)
        self.subsets: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for a in answerable:
            gold = set(a["relevant"])
            for b in answerable:
                if b is not a and set(b["relevant"]) <= gold and b["query"] != a["query"]:
                    self.subsets[a["qid"]].append(b)
        rng.shuffle(self.empty)

    def topics(self) -> list[str]:
        """Topics with at least two questions, shuffled; the rest after them."""
        rich = sorted(t for t, qs in self.by_topic.items() if len(qs) >= 2)
        poor = sorted(t for t, qs in self.by_topic.items() if len(qs) < 2)
        self.rng.shuffle(rich)
        self.rng.shuffle(poor)
        return rich + poor

    def question(self, topic: str, used_gold: set[str]) -> dict[str, Any] | None:
        """A question on `topic` whose gold is new to the conversation; ones with a same-topic
        partner first, so the conversation's same-topic turns have something to repeat."""
        fresh = [q for q in self.by_topic.get(topic, ()) if not set(q["relevant"]) & used_gold]
        if not fresh:
            return None
        paired = [q for q in fresh if self.subsets.get(q["qid"])]
        return self.rng.choice(paired or fresh)

    def any_question(self, used_gold: set[str]) -> dict[str, Any] | None:
        for topic in self.topics():
            found = self.question(topic, used_gold)
            if found is not None:
                return found
        return None

    def nothing(self) -> dict[str, Any] | None:
        if not self.empty:
            return None
        row = self.empty.pop()
        self.empty.insert(0, row)  # cycle through them
        return row


def build_conversations(
    rows: list[dict[str, Any]], count: int, seed: int, turns: int = TURNS_PER_CONVERSATION
) -> list[Conversation]:
    """`count` conversations of `turns` turns (stores in turn), reproducible for `seed`."""
    rng = random.Random(seed)
    by_store: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if _usable(row):
            by_store[row["store"]].append(row)
    stores = sorted(by_store)
    if not stores:
        return []
    pools = {s: _StorePool(by_store[s], rng) for s in stores}
    plan = [kind for block in PLAN for kind in block]
    plan = (plan * (turns // len(plan) + 1))[:turns]
    out = []
    for n in range(count):
        store = stores[n % len(stores)]
        cid = f"{store}/c{n // len(stores) + 1:02d}"
        out.append(_one(cid, store, pools[store], plan, rng))
    return out


def _one(
    cid: str, store: str, pool: _StorePool, plan: list[str], rng: random.Random
) -> Conversation:
    topics = iter(pool.topics())
    topic = next(topics, "")
    used_gold: set[str] = set()
    asked: list[dict[str, Any]] = []  # needs-memory questions so far, for same-topic repeats
    repeated: set[str] = set()
    turns: list[Turn] = []

    def add(prompt: str, kind: str, row: dict[str, Any] | None = None) -> None:
        turns.append(
            Turn(
                conversation=cid,
                no=len(turns) + 1,
                prompt=prompt,
                kind=kind,
                relevant=tuple(row.get("relevant") or ()) if row else (),
                answer=_answer(row.get("meta") or {}) if row else None,
                store=store,
                source_kind=row.get("kind") if row else None,
            )
        )

    for kind in plan:
        if kind in MEMORY_CLASSES:
            if kind == "topic_shift":
                topic = next(topics, topic)
            row = pool.question(topic, used_gold) or pool.any_question(used_gold)
            if row is None:
                kind = "nothing_relevant"
            else:
                used_gold |= set(row["relevant"])
                asked.append(row)
                add(row["query"], kind, row)
                continue
        if kind == "same_topic":
            repeat = _same_topic(pool, asked, repeated, rng)
            if repeat is not None:
                add(repeat["query"], kind, repeat)
                continue
            kind = "follow_up"
        if kind == "nothing_relevant":
            row = pool.nothing()
            if row is not None:
                add(row["query"], kind, {**row, "relevant": ()})
                continue
            kind = "follow_up"
        add(rng.choice(FOLLOW_UPS), "follow_up")
    return Conversation(cid, store, tuple(turns))


def _same_topic(
    pool: _StorePool, asked: list[dict[str, Any]], repeated: set[str], rng: random.Random
) -> dict[str, Any] | None:
    """A question whose gold is a subset of an earlier question's, newest topic first."""
    for earlier in reversed(asked):
        options = [q for q in pool.subsets.get(earlier["qid"], ()) if q["qid"] not in repeated]
        if options:
            pick = rng.choice(options)
            repeated.add(pick["qid"])
            return pick
    return None


def load_conversations(
    path: Path, count: int | None, seed: int, turns: int = TURNS_PER_CONVERSATION
) -> list[Conversation]:
    """A bench folder (its queries.jsonl) or a team's JSONL of prompts (the first `count`
    conversations, default all).

    A folder whose rows have sessions (`meta.session`) replays them; otherwise
    conversations are built from its questions (`count` of them, default one per store).
    A team's JSONL replays as written (`from_prompts`); its rows may use `prompt` for
    `query`, put `session`/`turn` at the top level, and give a `kind` from CLASSES.
    A line that is not a JSON object with a prompt is a ValueError naming its line.
    """
    if not path.is_dir():
        conversations = from_prompts([_team_row(r, n) for n, r in read_rows(path)])
        return conversations[:count] if count else conversations
    rows = [_normalise(r, n) for n, r in read_rows(path / "queries.jsonl")]
    if has_sessions(rows):
        conversations = from_sessions(rows)
        return conversations[:count] if count else conversations
    stores = {r["store"] for r in rows}
    return build_conversations(rows, count or len(stores), seed, turns)


def read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) for every non-blank line of a JSONL file; a line that is not UTF-8,
    not JSON or not an object is a ValueError that names it (json's own position would say
    line 1, the line being parsed alone). A byte-order mark opening the file is no part of
    its first row: Windows editors and PowerShell write one, and relay import and relay
    restore read such files too."""
    out: list[tuple[int, dict[str, Any]]] = []
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"line {n}: not UTF-8") from None
            if not line.strip():
                continue
            if not out and line.lstrip().startswith("["):  # what json.dump(rows) writes
                raise ValueError(
                    f"line {n}: a JSON array; a prompts file is JSONL, one JSON object a line"
                )
            try:
                # without its line break, which json would count as the start of a line 2
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {n}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f'line {n}: not a JSON object (a row is {{"prompt": ...}})')
            out.append((n, row))
    return out


def _team_row(row: dict[str, Any], line: int) -> dict[str, Any]:
    """A team's row, whose `kind` is the prompt's class (a bench folder's may be the data's
    own slice): a misspelt class would otherwise count as a class of its own."""
    out = _normalise(row, line)
    kind = out.get("kind")
    if kind is not None and kind not in (*CLASSES, UNLABELLED):
        raise ValueError(
            f"line {line}: kind {kind!r} is not one of {', '.join((*CLASSES, UNLABELLED))}"
        )
    if kind in QUIET_CLASSES and out["relevant"]:
        # judged by getting nothing, so its gold would count for nothing, unseen
        raise ValueError(
            f"line {line}: a {kind} prompt lists 'relevant' memories, but it should get "
            "nothing: give it kind needs_memory, or drop 'relevant'"
        )
    return out


def _normalise(row: dict[str, Any], line: int) -> dict[str, Any]:
    meta = row.get("meta") or {}
    if not isinstance(meta, dict):
        raise ValueError(f"line {line}: 'meta' is not an object")
    meta = dict(meta)
    for key in ("session", "turn", "answer"):
        if key in row and key not in meta:
            meta[key] = row[key]
    query = row.get("query") or row.get("prompt")
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"line {line}: no prompt (a 'query' or 'prompt' string)")
    relevant = row.get("relevant") or []
    if not isinstance(relevant, list) or not all(isinstance(g, str) for g in relevant):
        raise ValueError(f"line {line}: 'relevant' is not a list of memory ids")
    turn = meta.get("turn")
    if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int)):
        raise ValueError(f"line {line}: 'turn' is not a whole number")
    for key in ("store", "kind"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise ValueError(f"line {line}: '{key}' is not a string")
    if meta.get("session") is not None and not isinstance(meta["session"], str | int):
        raise ValueError(f"line {line}: 'session' is not a string or a number")
    return {
        **row,
        "store": row.get("store") or "team",
        "qid": row.get("qid") or f"line{line}",
        "query": query,
        "relevant": relevant,
        "answerable": row.get("answerable", bool(relevant)),
        "meta": meta,
    }


def write_jsonl(path: Path, conversations: list[Conversation]) -> None:
    """The conversations as replayed, one turn a line: a prompts file `relay eval replay`
    takes back as the same conversations. Without its `session`, each of its turns came
    back as a conversation of its own (QA: 4 conversations replayed again as 30)."""
    with path.open("w", encoding="utf-8") as fh:
        for conv in conversations:
            session = conv.id.removeprefix(f"{conv.store}/")
            for turn in conv.turns:
                row = {"session": session, **turn.to_dict()}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
