"""Whether a prompt is worth a search: length, throttle, topic shift.

Keywords are lower-cased runs of letters, digits and underscores of three or
more characters, minus filler: the closed word classes of English, which name no
topic (pronouns, determiners, prepositions, auxiliaries; quantifiers and degree
words: "a lot", "much", "quite"; the particles of phrasal verbs: "go ahead",
"carry along"), and chat (acknowledgements and interjections: "thanks", "ok",
"perfect", "oops"). Topic overlap is the Jaccard index of this prompt's keywords
and those of the last search.
"""

from __future__ import annotations

KEYWORD_SCAN_CHARS = 4000

STOPWORDS = frozenset(
    """
    about above after again against all also and any are aren because been before being below
    between both but can cannot could did didn does doesn doing don down during each few for from
    further had hadn has hasn have haven having her here hers herself him himself his how into isn
    its itself just let lets like more most mustn myself nor not now off once only other our ours
    ourselves out over own same shan she should shouldn some such than that the their theirs them
    themselves then there these they this those through too under until very was wasn were weren
    what when where which while who whom why will with won would wouldn you your yours yourself
    yourselves yes yeah yep okay please thanks thank sure right go going get got make made want
    need needs see look looks use using used one two try again continue proceed next still also
    well good great fine cool nice done let's it's that's what's i'm you're can't don't won't
    lot lots much many bit little less least enough plenty several quite rather really totally
    completely exactly almost ahead along away back forward around aside together alright
    awesome perfect excellent sorry cheers thx yup nope hmm wow oops
    """.split()
)


def keywords(text: str) -> list[str]:
    """Distinct keywords of `text`, in order of first appearance."""
    cleaned = "".join(
        ch if ch.isalnum() or ch == "_" else " " for ch in text[:KEYWORD_SCAN_CHARS].lower()
    )
    seen: dict[str, None] = {}
    for word in cleaned.split():
        if len(word) >= 3 and word not in STOPWORDS and not word.isdigit():
            seen[word] = None
    return list(seen)


def overlap(current: list[str], previous: list[str]) -> float:
    """Jaccard index of two keyword lists (0.0 when either is empty)."""
    a, b = set(current), set(previous)
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def skip_reason(prompt: str, words: list[str], state: dict, cfg) -> str | None:
    """Why this prompt should not search, or None to search. `state['count']` already counts it."""
    if len(prompt) < cfg.min_prompt_len:
        return "short_prompt"
    if not words:
        return "no_keywords"
    last = state["last_search"]  # the last search that injected something, or failed
    if last and state["count"] - last <= cfg.throttle_prompts:
        return "throttled"
    if state["keywords"] and overlap(words, state["keywords"]) >= cfg.overlap_threshold:
        return "same_topic"
    return None
