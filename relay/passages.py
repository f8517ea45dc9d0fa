"""Splitting a memory into passages: the smallest useful units that search returns.

A short memory is one passage. A long one is cut at paragraph, then sentence
boundaries into passages of at most `MAX_PASSAGE_CHARS`, so a result carries
the part that matched rather than a whole document; the title travels with
every passage because it is what tells the reader (and the ranker) what the
passage is about.
"""

from __future__ import annotations

import re

MAX_PASSAGE_CHARS = 700

_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(\[*-])")


def split_passages(body: str, max_chars: int = MAX_PASSAGE_CHARS) -> list[str]:
    """Cut `body` into passages of at most `max_chars`, never mid-word unless a word is longer."""
    body = body.strip()
    if len(body) <= max_chars:
        return [body]
    pieces: list[tuple[str, str]] = []  # (text, what joins it to the piece before)
    for para in _PARAGRAPH.split(body):
        para = para.strip()
        if not para:
            continue
        if len(para) <= max_chars:
            pieces.append((para, "\n\n"))
            continue
        # A paragraph's sentences stay one paragraph: a passage shows the text as written.
        for i, part in enumerate(
            p for sentence in _SENTENCE.split(para) for p in _hard_wrap(sentence.strip(), max_chars)
        ):
            pieces.append((part, " " if i else "\n\n"))
    passages: list[str] = []
    current = ""
    for piece, glue in pieces:
        joined = f"{current}{glue}{piece}" if current else piece
        if len(joined) <= max_chars:
            current = joined
        else:
            if current:
                passages.append(current)
            current = piece
    if current:
        passages.append(current)
    return passages


def _hard_wrap(text: str, max_chars: int) -> list[str]:
    if len(text) <= max_chars:
        return [text] if text else []
    out: list[str] = []
    line = ""
    for word in text.split():
        while len(word) > max_chars:
            if line:
                out.append(line)
                line = ""
            out.append(word[:max_chars])
            word = word[max_chars:]
        candidate = f"{line} {word}" if line else word
        if len(candidate) <= max_chars:
            line = candidate
        else:
            out.append(line)
            line = word
    if line:
        out.append(line)
    return out
