"""Text normalisation shared by indexing and querying, in every store.

Both stores index `lexical_terms()` output rather than raw text, so the SQLite
FTS5 index and the PostgreSQL tsvector see exactly the same tokens and rank
the same query the same way. The stemmer is deliberately light (plural,
-ing, -ed): over-stemming merges words a team keeps apart ("tests"/"testing"
stay close, "organization"/"organ" do not).
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)

STOPWORDS = frozenset(
    """a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further had hadn't has hasn't have haven't
    having he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll
    i'm i've if in into is isn't it it's its itself let's me more most mustn't my myself no nor
    not of off on once only or other ought our ours ourselves out over own same shan't she she'd
    she'll she's should shouldn't so some such than that that's the their theirs them themselves
    then there there's these they they'd they'll they're they've this those through to too under
    until up very was wasn't we we'd we'll we're we've were weren't what what's when when's where
    where's which while who who's whom why why's with won't would wouldn't you you'd you'll
    you're you've your yours yourself yourselves also just get got us please let like make
    want need s t""".split()
)


def stem(word: str) -> str:
    """Strip the commonest inflections; leave short words alone."""
    if len(word) <= 3 or word.isdigit():
        return word
    for suffix, repl in (
        ("ies", "y"),
        ("sses", "ss"),
        ("ing", ""),
        ("ed", ""),
        ("es", "e"),
        ("s", ""),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                return word
            base = word[: len(word) - len(suffix)] + repl
            # "running" -> "runn" -> "run": undo a doubled final consonant left by -ing/-ed.
            if (
                suffix in ("ing", "ed")
                and len(base) > 3
                and base[-1] == base[-2]
                and base[-1] not in "lsz"
            ):
                base = base[:-1]
            return base
    return word


def _fold(raw: str) -> str:
    """A word as the index sees it: lower-cased, apostrophes folded ("team's" -> "team")."""
    w = raw.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    return w.replace("'", "")


def words(text: str, limit: int | None = None) -> list[str]:
    """Lower-cased word tokens, apostrophes folded ("team's" -> "team"); the first `limit`."""
    out: list[str] = []
    for m in _WORD.finditer(text.lower()):
        w = _fold(m.group())
        if w:
            out.append(w)
            if limit is not None and len(out) >= limit:
                break
    return out


def word_spans(text: str) -> list[tuple[int, int, str | None]]:
    """Each word's character span in `text` and its query term (None for a stopword).

    Matched on `text` itself, not lower-cased, so the spans line up with the tokenizer's."""
    out = []
    for m in _WORD.finditer(text):
        w = _fold(m.group())
        if w:
            out.append((m.start(), m.end(), None if w in STOPWORDS else stem(w)))
    return out


def lexical_terms(text: str) -> list[str]:
    """The stemmed tokens an index stores for `text` (stopwords kept)."""
    return [stem(w) for w in words(text)]


def query_terms(text: str) -> list[str]:
    """Distinct stemmed content words of a query, in first-seen order."""
    seen: dict[str, None] = {}
    for w in words(text):
        if w in STOPWORDS:
            continue
        seen.setdefault(stem(w), None)
    return list(seen)


def identifier_shaped(term: str) -> bool:
    """Whether a query term reads as an identifier rather than a word: letters and digits
    together (`t13q`, `v2`, `s3`, `boto3`, `5k`) or four digits and more (an error code, a
    port, a ticket number). A plain number ("20 at a time", "19%") is a quantity."""
    has_digit = any(c.isdigit() for c in term)
    return (has_digit and any(c.isalpha() for c in term)) or (term.isdigit() and len(term) >= 4)


_NAME = re.compile(r"(?<![\w.])([A-Z][a-z]+(?:[A-Z][a-z]+)*)\b")


def proper_names(text: str) -> list[str]:
    """Capitalised words that are not merely sentence-initial, stemmed like index terms.

    A question like "What did Melanie paint?" is about Melanie: a passage that
    never mentions her is at best a near miss.
    """
    names: dict[str, None] = {}
    for m in _NAME.finditer(text):
        start = m.start()
        before = text[:start].rstrip()
        if not before or before[-1] in ".!?:\n":
            continue
        w = m.group(1).lower()
        if w in STOPWORDS:
            continue
        names.setdefault(stem(w), None)
    return list(names)


def subject_terms(title: str | None, text: str) -> set[str]:
    """The stemmed first words of a title and of a passage: whom or what it is about.

    Notes name their subject first ("Staging: ...", "Melanie painted ..."), and
    transcript lines their speaker ("Caroline: I went ..."), so a passage whose head
    names someone else is about someone else even when it mentions the asked-about name.
    """
    out: set[str] = set()
    for part in (title or "", text):
        head = part[:80]
        if ":" in head[:40]:
            head = head.split(":", 1)[0]
        out.update(stem(w) for w in words(head, 2))
    return out
