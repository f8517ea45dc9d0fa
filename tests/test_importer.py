"""`relay import` parsing: Markdown sections, rule files, ids, sizes and file discovery."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from relay.errors import InvalidRequestError, SecretDetectedError
from relay.hygiene import (
    MAX_BODY_CHARS,
    check_body,
    check_source,
    check_tags,
    check_title,
)
from relay.import_files import iter_import_files, source_for
from relay.import_writer import check_drafts, continued_ids
from relay.importer import (
    ImportDraft,
    draft_id,
    drafts_from_path,
    drafts_from_text,
    split_front_matter,
    split_long,
)

BENCH = Path(__file__).resolve().parents[1] / ".." / "shared" / "bench"

CLAUDE_MD = """\
This file guides coding agents in this repository.

# Project

Relay is a team-memory server.

## Testing

Run `pytest -q` from the repository root.

```bash
# this is a shell comment, not a heading
pytest -k store
```

### Fixtures

Use `tmp_path`; never write to the working tree.

## Empty section

## Deploy ##

Deploys go through `make release`.

# Conventions

~~~~python
# still code
````
# still code: a shorter or different fence does not close it
~~~~

    # indented code, not a heading

#hashtag is not a heading either
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def titles_and_bodies(drafts: list[ImportDraft]) -> list[tuple[str | None, str]]:
    return [(d.title, d.body) for d in drafts]


# --- Markdown ------------------------------------------------------------------------------


def test_markdown_one_memory_per_section(tmp_path):
    path = write(tmp_path / "CLAUDE.md", CLAUDE_MD)
    drafts = drafts_from_path(path, tmp_path)
    assert titles_and_bodies(drafts) == [
        (None, "This file guides coding agents in this repository."),
        ("Project", "Relay is a team-memory server."),
        (
            "Project › Testing",
            "Run `pytest -q` from the repository root.\n\n```bash\n"
            "# this is a shell comment, not a heading\npytest -k store\n```",
        ),
        ("Project › Testing › Fixtures", "Use `tmp_path`; never write to the working tree."),
        ("Project › Deploy", "Deploys go through `make release`."),
        (
            "Conventions",
            "~~~~python\n# still code\n````\n"
            "# still code: a shorter or different fence does not close it\n~~~~\n\n"
            "    # indented code, not a heading\n\n#hashtag is not a heading either",
        ),
    ]
    assert {d.source for d in drafts} == {"CLAUDE.md"}
    assert all(d.tags == () for d in drafts)
    assert all(d.id.startswith("imp_") and len(d.id) == 20 for d in drafts)
    assert len({d.id for d in drafts}) == len(drafts)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "# A\na\n### C\nc\n## B\nb\n# D\nd\n",
            [("A", "a"), ("A › C", "c"), ("A › B", "b"), ("D", "d")],
            id="levels-skipped-and-popped",
        ),
        pytest.param(
            "Title\n=====\n\nintro\n\nSub\n---\n\nbody\n",
            [("Title", "intro"), ("Title › Sub", "body")],
            id="setext",
        ),
        pytest.param(
            "para one\n\n---\n\nafter a rule\n",
            [(None, "para one\n\n---\n\nafter a rule")],
            id="thematic-break-is-not-setext",
        ),
        pytest.param(
            "- item\n---\nafter\n",
            [(None, "- item\n---\nafter")],
            id="list-item-is-not-setext",
        ),
        pytest.param(
            "## **Bold** heading ###\ntext\n",
            [("**Bold** heading", "text")],
            id="closing-hashes",
        ),
        pytest.param(
            "# Only headings\n## Nothing below\n",
            [],
            id="all-empty",
        ),
        pytest.param(
            "```\n# unclosed fence\n\n## runs to the end\n",
            [(None, "```\n# unclosed fence\n\n## runs to the end")],
            id="unclosed-fence",
        ),
        pytest.param(
            "# A\n```js\nconst a = 1; // ``` inside\n```\n# B\nb\n",
            [("A", "```js\nconst a = 1; // ``` inside\n```"), ("B", "b")],
            id="fence-closes-only-on-a-bare-fence",
        ),
        pytest.param(
            "   ### Indented three\nok\n    ### indented four is code\n",
            [("Indented three", "ok\n    ### indented four is code")],
            id="atx-indentation",
        ),
    ],
)
def test_markdown_headings(text, expected):
    assert titles_and_bodies(drafts_from_text(text, "notes.md")) == expected


def test_crlf_bom_and_trailing_whitespace_are_normalised(tmp_path):
    path = tmp_path / "AGENTS.md"
    path.write_bytes("\ufeff# Setup   \r\n\r\nRun make.   \r\nThen test.\t\r\n".encode())
    assert titles_and_bodies(drafts_from_path(path, tmp_path)) == [
        ("Setup", "Run make.\nThen test.")
    ]


def test_duplicate_headings_get_distinct_stable_ids():
    text = "## Notes\none\n## Notes\ntwo\n## Notes\none\n"
    first, second, third = drafts_from_text(text, "a.md")
    assert first.title == second.title == third.title == "Notes"
    assert len({first.id, second.id, third.id}) == 3  # identical twins too
    assert first.id == draft_id("a.md", ("Notes",), text="one")
    assert second.id == draft_id("a.md", ("Notes",), text="two")
    assert third.id == draft_id("a.md", ("Notes",), text="one", twin=1)


def test_namesake_ids_do_not_depend_on_their_place():
    """QA: with two `## Testing` sections, removing the first wrote the second's text over
    the first's memory, and restoring it flipped them back: an id was the place among the
    sections of one heading path, which all the rules of a rule file share. Now a section's
    id holds whatever moves around it."""
    both = "## Testing\nUse pytest.\n\n## Testing\nRun it in CI.\n"
    first, second = drafts_from_text(both, "AGENTS.md")
    (alone,) = drafts_from_text("## Testing\nRun it in CI.\n\n## Testing\n", "AGENTS.md")
    assert alone.id == second.id
    assert [d.id for d in drafts_from_text(both, "AGENTS.md")] == [first.id, second.id]

    rules = "- Rule alpha: use tabs.\n- Rule beta: use tabs.\n- Rule gamma: use tabs.\n"
    rules += "- Rule delta: use tabs.\n"
    before = {d.body: d.id for d in drafts_from_text(rules, ".cursorrules", rules=True)}
    after = drafts_from_text(rules.split("\n", 1)[1], ".cursorrules", rules=True)
    assert [d.body for d in after] == [
        "Rule beta: use tabs.",
        "Rule gamma: use tabs.",
        "Rule delta: use tabs.",
    ]
    assert [d.id for d in after] == [before[d.body] for d in after]


def test_a_section_alone_under_its_heading_keeps_the_id_it_had():
    """Ids of sections under a heading of their own are what they were before namesakes
    were named by their text, so databases imported before see no change."""
    old = "imp_" + hashlib.sha256(b"a.md\0Build\x000").hexdigest()[:16]
    (build,) = drafts_from_text("# Build\nRun make.\n", "a.md")
    assert build.id == old == draft_id("a.md", ("Build",))


RULES = "".join(f"- Rule {name}: use tabs.\n" for name in ("alpha", "beta", "gamma", "delta"))


def stored(drafts: list[ImportDraft], ids: list[str] | None = None) -> list[dict]:
    """The live memories an import of `drafts` left (under `ids`, if other)."""
    ids = ids or [d.id for d in drafts]
    return [{"id": i, "title": d.title, "body": d.body} for i, d in zip(ids, drafts, strict=True)]


def continued(text: str, live: list[dict], source: str = ".cursorrules") -> list[str]:
    return [d.id for d in continued_ids(drafts_from_text(text, source, rules=True), live)]


def test_an_older_import_keeps_its_ids_whatever_moves():
    """Rules imported by an older release carry ids by place: they keep them, each with its
    own text, when an unchanged file or one missing a rule is imported again."""
    drafts = drafts_from_text(RULES, ".cursorrules", rules=True)
    by_place = [
        "imp_" + hashlib.sha256(f".cursorrules\0\0{n}".encode()).hexdigest()[:16] for n in range(4)
    ]
    live = stored(drafts, by_place)
    assert continued(RULES, live) == by_place
    assert continued(RULES.split("\n", 1)[1], live) == by_place[1:]
    assert continued("- Rule zeta: new.\n" + RULES, live)[1:] == by_place


def test_an_edited_section_continues_its_memory():
    drafts = drafts_from_text(RULES, ".cursorrules", rules=True)
    live = stored(drafts)
    ids = [d.id for d in drafts]
    reworded = RULES.replace("beta: use tabs.", "beta: use tabs everywhere.")
    assert continued(reworded, live) == ids
    unrelated = RULES.replace("Rule beta: use tabs.", "Never push to main on Fridays.")
    fresh = continued(unrelated, live)
    assert fresh[0] == ids[0] and fresh[2:] == ids[2:] and fresh[1] not in ids

    guide = drafts_from_text("# Build\nRun make.\n# Test\nRun pytest.\n", "a.md")
    live = stored(guide)
    renamed = drafts_from_text("# Building\nRun make.\n# Test\nRun tox.\n", "a.md")
    assert [d.id for d in continued_ids(renamed, live)] == [d.id for d in guide]
    # a section back after being retired lives at its next generation
    generations = stored(guide, [guide[0].id + ".2", guide[1].id])
    assert [d.id for d in continued_ids(renamed, generations)] == [
        guide[0].id + ".2",
        guide[1].id,
    ]


def test_of_two_live_generations_the_oldest_continues():
    """A section can live at two generations (keys for different audiences imported the
    file, the second past an id it could not read): the draft goes to the oldest, whatever
    order they come in (`.10` after `.9`), and the other is left to be retired."""
    (draft,) = drafts_from_text("# Build\nRun make.\n", "a.md")
    for suffixes in ([".10", ".9"], ["", ".2"], [".2", ""]):
        live = stored([draft] * 2, [draft.id + suffix for suffix in suffixes])
        oldest = min(suffixes, key=lambda s: int(s[1:] or 1))
        assert [d.id for d in continued_ids([draft], live)] == [draft.id + oldest]


def test_filling_an_empty_section_does_not_renumber_its_namesakes():
    before = drafts_from_text("## Notes\n\n## Notes\ntwo\n", "a.md")
    after = drafts_from_text("## Notes\none\n## Notes\ntwo\n", "a.md")
    assert [d.id for d in before] == [after[1].id]


def test_reimport_is_idempotent_and_ids_follow_source_and_section(tmp_path):
    path = write(tmp_path / "docs" / "guide.md", CLAUDE_MD)
    again = drafts_from_path(path, tmp_path)
    assert drafts_from_path(path, tmp_path) == again
    assert {d.source for d in again} == {"docs/guide.md"}

    # Editing one section changes that body only; every id stays put.
    path.write_text(CLAUDE_MD.replace("make release", "make ship"), encoding="utf-8")
    edited = drafts_from_path(path, tmp_path)
    assert [d.id for d in edited] == [d.id for d in again]
    changed = [(a.title, b.body) for a, b in zip(again, edited, strict=True) if a != b]
    assert changed == [("Project › Deploy", "Deploys go through `make ship`.")]

    # The same file under another path is another set of memories.
    other = write(tmp_path / "other" / "guide.md", CLAUDE_MD)
    assert not {d.id for d in drafts_from_path(other, tmp_path)} & {d.id for d in again}


def test_empty_and_whitespace_files_yield_nothing(tmp_path):
    assert drafts_from_path(write(tmp_path / "empty.md", ""), tmp_path) == []
    assert drafts_from_path(write(tmp_path / "blank.md", "\n  \n\t\n"), tmp_path) == []


def test_unknown_text_file_named_explicitly_reads_as_markdown(tmp_path):
    path = write(tmp_path / "NOTES.txt", "# Release\nTag from main only.\n")
    assert titles_and_bodies(drafts_from_path(path, tmp_path)) == [
        ("Release", "Tag from main only.")
    ]


def test_unreadable_files_raise_relay_errors(tmp_path):
    binary = tmp_path / "blob.md"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InvalidRequestError, match="not UTF-8"):
        drafts_from_path(binary, tmp_path)
    with pytest.raises(InvalidRequestError, match="cannot read"):
        drafts_from_path(tmp_path / "missing.md", tmp_path)


# --- sizes ---------------------------------------------------------------------------------


def test_long_sections_are_split_into_titled_parts(tmp_path):
    paragraph = ("Keep migrations reversible and small. " * 40).strip()
    code = "```sql\n" + "\n".join(f"-- step {i}" for i in range(50)) + "\n```"
    blocks = [paragraph] * 30 + [code] + [paragraph] * 20
    body = "\n\n".join(blocks)
    assert len(body) > 2 * MAX_BODY_CHARS
    path = write(tmp_path / "big.md", "# Migrations\n\n" + body + "\n\n# After\nshort\n")

    drafts = drafts_from_path(path, tmp_path)
    parts = [d for d in drafts if d.title != "After"]
    assert len(parts) >= 3
    assert [d.title for d in parts] == [f"Migrations (part {i})" for i in range(1, len(parts) + 1)]
    assert all(len(d.body) <= MAX_BODY_CHARS for d in parts)
    assert "\n\n".join(d.body for d in parts) == body  # nothing lost, cuts between paragraphs
    assert any(code in d.body for d in parts)  # a code block that fits is never cut
    assert parts[0].id == draft_id("big.md", ("Migrations",))  # part 1 keeps the section id
    assert len({d.id for d in drafts}) == len(drafts)
    assert drafts[-1].title == "After"


def test_split_long_falls_back_to_lines_then_characters():
    lines = "\n".join("x" * 90 for _ in range(30))  # one 2,729-char paragraph
    parts = split_long(lines, 1000)
    assert all(len(p) <= 1000 for p in parts)
    assert "\n".join(parts) == lines
    one_line = "y" * 2500
    assert split_long(one_line, 1000) == ["y" * 1000, "y" * 1000, "y" * 500]
    assert split_long("short", 1000) == ["short"]


def test_split_long_cuts_a_long_line_between_words():
    # One long paragraph on a single line (an editor's soft wrap) was cut at the limit
    # itself, mid-word: "word190" in one memory, "1" in the next, found by neither.
    words = [f"word{i}" for i in range(800)]
    parts = split_long(" ".join(words), 1000)
    assert all(len(part) <= 1000 for part in parts)
    assert [w for part in parts for w in part.split()] == words


def test_preamble_too_long_gets_part_titles():
    drafts = drafts_from_text(("word " * 4000).strip(), "notes.md")
    assert [d.title for d in drafts] == ["Part 1", "Part 2"]


# --- .cursorrules --------------------------------------------------------------------------

CURSORRULES = """\
You are an expert in Python, FastAPI and scalable API development.

Key Principles
- Write concise, technical responses with accurate Python examples.
- Prefer iteration and modularization
  over code duplication.
  - Nested detail stays with its rule.
- Use this pattern for routers:
  ```python
  # not a heading, not a new rule
  - not a bullet either
  ```

Error Handling:
* Handle errors at the beginning of functions.
* Use guard clauses.

Performance is a feature; measure it before and after every change.

## Testing
1. Use pytest with fixtures.
2) Keep tests hermetic.
"""


def test_bullet_style_cursorrules_one_memory_per_rule(tmp_path):
    path = write(tmp_path / ".cursorrules", CURSORRULES)
    drafts = drafts_from_path(path, tmp_path)
    assert titles_and_bodies(drafts) == [
        (None, "You are an expert in Python, FastAPI and scalable API development."),
        ("Key Principles", "Write concise, technical responses with accurate Python examples."),
        (
            "Key Principles",
            "Prefer iteration and modularization\nover code duplication.\n"
            "- Nested detail stays with its rule.",
        ),
        (
            "Key Principles",
            "Use this pattern for routers:\n```python\n# not a heading, not a new rule\n"
            "- not a bullet either\n```",
        ),
        ("Error Handling", "Handle errors at the beginning of functions."),
        ("Error Handling", "Use guard clauses."),
        (None, "Performance is a feature; measure it before and after every change."),
        ("Testing", "Use pytest with fixtures."),
        ("Testing", "Keep tests hermetic."),
    ]
    assert {d.source for d in drafts} == {".cursorrules"}
    assert len({d.id for d in drafts}) == len(drafts)


def test_indented_bullets_under_labels_are_top_level_rules():
    text = "Style\n  - Use ruff.\n  - Use mypy.\n\nNaming\n  - snake_case functions.\n"
    assert titles_and_bodies(drafts_from_text(text, ".cursorrules", rules=True)) == [
        ("Style", "Use ruff."),
        ("Style", "Use mypy."),
        ("Naming", "snake_case functions."),
    ]


def test_prose_cursorrules_is_split_by_section():
    text = (
        "You are a senior engineer.\n\nWrite small functions. Prefer clarity.\n\n"
        "# Testing\nTests run with pytest.\n- one list item does not make it bullet-style\n"
    )
    assert titles_and_bodies(drafts_from_text(text, ".cursorrules", rules=True)) == [
        (None, "You are a senior engineer.\n\nWrite small functions. Prefer clarity."),
        ("Testing", "Tests run with pytest.\n- one list item does not make it bullet-style"),
    ]


def test_markdown_files_are_never_split_per_bullet():
    text = "# Rules\n- one\n- two\n- three\n"
    assert titles_and_bodies(drafts_from_text(text, "AGENTS.md")) == [
        ("Rules", "- one\n- two\n- three")
    ]


def test_real_cursorrules_round_trip_one_rule_per_memory():
    """Every rule file of the benchmark, rebuilt as a .cursorrules, yields its rules exactly."""
    path = BENCH / "cursorrules_bullets" / "memories.jsonl"
    if not path.exists():
        pytest.skip(f"benchmark data not present at {path}")
    by_file: dict[str, list[dict]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        by_file[record["meta"]["file"]].append(record)
    assert len(by_file) == 207
    all_ids: set[str] = set()
    for name, records in by_file.items():
        lines: list[str] = []
        heading: object = object()
        for record in records:
            if record["meta"].get("heading") != heading:
                heading = record["meta"].get("heading")
                if heading:
                    lines += ["", f"## {heading}", ""]
            lines.append(f"- {record['text']}")
        source = f"{name}/.cursorrules"
        drafts = drafts_from_text("\n".join(lines), source, rules=True)
        expected = [(r["meta"].get("heading") or None, r["text"]) for r in records]
        assert titles_and_bodies(drafts) == expected, name
        all_ids |= {d.id for d in drafts}
    assert len(all_ids) == sum(len(r) for r in by_file.values())


# --- .mdc ----------------------------------------------------------------------------------

MDC = """\
---
description: React component conventions
globs: src/components/**/*.{ts,tsx}, app/*.tsx
alwaysApply: true
---

- Use function components with hooks.
- Keep components under 200 lines.

## Styling
- Tailwind only; no CSS modules.
- Use design tokens.
"""


def test_mdc_front_matter_becomes_title_context_and_tags(tmp_path):
    path = write(tmp_path / ".cursor" / "rules" / "react.mdc", MDC)
    drafts = drafts_from_path(path, tmp_path)
    assert titles_and_bodies(drafts) == [
        ("React component conventions", "Use function components with hooks."),
        ("React component conventions", "Keep components under 200 lines."),
        ("React component conventions › Styling", "Tailwind only; no CSS modules."),
        ("React component conventions › Styling", "Use design tokens."),
    ]
    assert {d.tags for d in drafts} == {
        ("glob:src/components/**/*.{ts,tsx}", "glob:app/*.tsx", "always-apply")
    }
    assert {d.source for d in drafts} == {".cursor/rules/react.mdc"}


def test_mdc_description_does_not_change_ids():
    before = drafts_from_text(MDC, "r.mdc", rules=True)
    after = drafts_from_text(MDC.replace("React component", "UI"), "r.mdc", rules=True)
    assert [d.id for d in before] == [d.id for d in after]
    assert after[0].title == "UI conventions"


def test_mdc_without_bullets_is_split_by_section():
    text = (
        "---\ndescription: 'API errors'\nglobs:\nalwaysApply: false\n---\n"
        "# Errors\nReturn one JSON error shape.\n\n# Logging\nLog at the boundary.\n"
    )
    drafts = drafts_from_text(text, "errors.mdc", rules=True)
    assert titles_and_bodies(drafts) == [
        ("API errors › Errors", "Return one JSON error shape."),
        ("API errors › Logging", "Log at the boundary."),
    ]
    assert all(d.tags == () for d in drafts)


@pytest.mark.parametrize(
    ("front", "meta"),
    [
        pytest.param(
            "description: Plain\nglobs: a/*.py\nalwaysApply: false",
            {"description": "Plain", "globs": "a/*.py", "alwaysApply": "false"},
            id="scalars",
        ),
        pytest.param(
            'description: "Quoted: with colon"\nglobs: [\'*.ts\', "src/**/*.{js,jsx}"]',
            {"description": "Quoted: with colon", "globs": ["*.ts", "src/**/*.{js,jsx}"]},
            id="flow-list",
        ),
        pytest.param(
            "globs:\n  - '*.py'\n  - tests/**\n# a comment\ndescription: >\n  Folded\n  text",
            {"globs": ["*.py", "tests/**"], "description": "Folded text"},
            id="block-list-and-folded-scalar",
        ),
    ],
)
def test_front_matter_without_yaml(front, meta):
    parsed, body = split_front_matter(f"---\n{front}\n---\nbody")
    assert parsed == meta
    assert body == "body"


def test_front_matter_needs_both_fences():
    text = "---\ndescription: never closed\n\n- rule"
    assert split_front_matter(text) == ({}, text)
    assert split_front_matter("no front matter\n---\n") == ({}, "no front matter\n---\n")


def test_globs_that_cannot_be_tags_are_dropped():
    text = "---\nglobs: src/my dir/*.ts, ok/*.ts\n---\n- rule one\n- rule two\n"
    assert {d.tags for d in drafts_from_text(text, "x.mdc", rules=True)} == {("glob:ok/*.ts",)}


def test_long_description_is_shortened_in_titles():
    text = "---\ndescription: " + "very " * 40 + "long\n---\n# Section\nbody\n"
    (draft,) = drafts_from_text(text, "x.mdc", rules=True)
    context, section = draft.title.split(" › ")
    assert len(context) <= 80 and context.endswith("…")
    assert section == "Section"


# --- every draft is a valid write ----------------------------------------------------------


def test_drafts_pass_write_hygiene(tmp_path):
    write(tmp_path / "CLAUDE.md", CLAUDE_MD)
    write(tmp_path / ".cursorrules", CURSORRULES)
    write(tmp_path / ".cursor" / "rules" / "react.mdc", MDC)
    write(tmp_path / "docs" / "big.md", "# " + "Long heading " * 30 + "\n" + "text " * 5000)
    drafts = [d for f in iter_import_files([tmp_path]) for d in drafts_from_path(f, tmp_path)]
    assert len(drafts) > 15
    for d in drafts:
        assert check_body(d.body) == d.body
        assert check_title(d.title) == d.title
        assert check_source(d.source) == d.source
        assert check_tags(d.tags) == d.tags


def test_check_drafts_names_file_and_section():
    token = "gh" + "p_" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"
    check_drafts(drafts_from_text("# Ops\nmake ship\n", "CLAUDE.md"))
    with pytest.raises(SecretDetectedError, match=r"^notes\.md › part 1: memory looks like"):
        check_drafts(drafts_from_text(f"TOKEN={token}\n# Ops\nok\n", "notes.md"))
    # an untitled rule by its place, not its text (QA: only the file was named)
    rules = drafts_from_text(
        f"- Prefer pathlib.\n- Deploy with TOKEN={token}\n", "app/.cursorrules", rules=True
    )
    with pytest.raises(
        SecretDetectedError, match=r"^app/\.cursorrules › rule 2: memory looks"
    ) as e:
        check_drafts(rules)
    assert token not in str(e.value)
    with pytest.raises(SecretDetectedError, match=r"^CLAUDE\.md › Ops › CI: memory looks"):
        check_drafts(drafts_from_text(f"# Ops\nok\n## CI\nTOKEN={token}\n", "CLAUDE.md"))


def test_check_drafts_refuses_a_format_character_in_a_source_or_tag_before_anything_is_written():
    """The server judges a bidi override in a source or a tag against what the memory holds
    (an older release's, kept), so its batch, after those before it, would be refused; an
    import gives the file's values anew, so it refuses them first, naming file and section."""
    glob = "---\nglobs: src/\u202e*.py\n---\n# Style\nPrefer pathlib.\n"
    with pytest.raises(InvalidRequestError, match=r"^rules\.mdc › Style: tag .* U\+202E \("):
        check_drafts(drafts_from_text(glob, "rules.mdc", rules=True))
    with pytest.raises(InvalidRequestError, match=r"^'ops/\\u2066x\.md' › Ops: source .* U\+2066"):
        check_drafts(drafts_from_text("# Ops\nok\n", "ops/\u2066x.md"))


def test_check_drafts_keeps_a_file_name_an_older_release_stored_where_its_memories_hold_it():
    """QA: a file whose name holds a bidi control, imported by an older release, could not
    be imported again until renamed, though the server keeps a value its memory holds. A
    section that continues such a memory passes, as its batch item will; a new section, a
    new memory, is refused as the server would refuse it, saying why and what to do. Only
    for a file whose name holds one are its memories asked for."""
    legacy = "ops/\u202efdp.md"
    before = drafts_from_text("# Ops\nFreeze at noon.\n", legacy)
    held = [
        {"id": d.id, "title": d.title, "body": d.body, "source": legacy, "tags": []} for d in before
    ]
    asked: list[str] = []

    def owned(source: str) -> list[dict]:
        asked.append(source)
        return held if source == legacy else []

    edited = drafts_from_text("# Ops\nFreeze at one.\n", legacy)
    check_drafts([*drafts_from_text("# Ok\nfine\n", "ops/ok.md"), *edited], (), owned)
    assert asked == [legacy]
    grown = drafts_from_text("# Ops\nFreeze at one.\n# CI\nRun make.\n", legacy)
    with pytest.raises(InvalidRequestError) as refused:
        check_drafts(grown, (), owned)
    assert refused.value.message == (
        "'ops/\\u202efdp.md' › CI: source contains U+202E (RIGHT-TO-LEFT OVERRIDE) at"
        " character 4, an invisible character that changes how the text shows; remove it;"
        " the memories imported from this file before keep its name (an older release"
        " stored it), but this section would be a new memory, which may not take it. The"
        " source is the file's path: rename the file (or the folder holding it) and import"
        " it again"
    )
    assert refused.value.details == {"field": "source", "code_point": "U+202E"}
    with pytest.raises(InvalidRequestError, match="remove it. The source is the file's path"):
        check_drafts(grown, (), lambda _: [])


# --- sources and file discovery ------------------------------------------------------------


def test_source_is_relative_posix_under_a_root(tmp_path):
    nested = write(tmp_path / "a" / "b" / "AGENTS.md", "x")
    assert source_for(nested, tmp_path) == "a/b/AGENTS.md"
    assert source_for(nested, tmp_path / "a") == "b/AGENTS.md"
    assert source_for(nested, tmp_path, "team") == "team/a/b/AGENTS.md"
    with pytest.raises(InvalidRequestError, match="not inside"):
        source_for(nested, tmp_path / "elsewhere")
    link = tmp_path / "a" / "linked.md"
    link.symlink_to(write(tmp_path / "target.md", "x"))
    assert source_for(link, tmp_path / "a") == "linked.md"  # leads out of the root: its name
    assert source_for(link, tmp_path) == "target.md"  # leads inside it: the file it names


def test_a_symlink_inside_a_work_tree_is_named_by_the_file_it_leads_to(tmp_path, monkeypatch):
    """QA: with CLAUDE.md -> AGENTS.md, `relay import .` made one memory per section, but
    `relay import CLAUDE.md` made a second copy of each under acme/widgets/CLAUDE.md."""
    repo = tmp_path / "widgets"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    agents = write(repo / "AGENTS.md", "x")
    (repo / "CLAUDE.md").symlink_to("AGENTS.md")
    (repo / "docs").mkdir()
    (repo / "docs" / "AGENTS.md").symlink_to("../AGENTS.md")
    (repo / "guides").symlink_to("docs", target_is_directory=True)
    monkeypatch.chdir(repo)
    for path in ("CLAUDE.md", "docs/AGENTS.md", "guides/AGENTS.md", str(repo / "CLAUDE.md")):
        assert source_for(Path(path)) == "widgets/AGENTS.md", path
    assert source_for(agents, prefix="acme") == "acme/AGENTS.md"
    assert source_for(repo / "CLAUDE.md", prefix="acme") == "acme/AGENTS.md"
    # Out of the work tree: named where it sits, as each teammate's clone holds it.
    shared = write(tmp_path / "dotfiles" / "rules.md", "x")
    (repo / "RULES.md").symlink_to(shared)
    assert source_for(repo / "RULES.md") == "widgets/RULES.md"
    # Into a repository inside this one (a submodule): named where it sits here, too.
    inner = tmp_path / "widgets" / "vendor"
    subprocess.run(["git", "init", "-q", str(inner)], check=True)
    write(inner / "NOTES.md", "x")
    (repo / "NOTES.md").symlink_to("vendor/NOTES.md")
    assert source_for(repo / "NOTES.md") == "widgets/NOTES.md"


def test_a_file_outside_git_is_named_by_its_place_from_any_folder(tmp_path, monkeypatch):
    """QA: outside a git work tree the source was relative to the working directory, or
    just the file's name: projA/CLAUDE.md and projB/CLAUDE.md, each imported from its own
    folder, were one memory (B overwrote A), x/notes.md imported from z retired
    y/notes.md's, and from the parent folder it became a second copy."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    a = write(home / "projA" / "CLAUDE.md", "x")
    b = write(home / "projB" / "CLAUDE.md", "x")
    srv = write(tmp_path / "srv" / "docs" / "notes.md", "x")
    (home / "z").mkdir()
    (tmp_path / "srv-link").symlink_to(tmp_path / "srv", target_is_directory=True)
    for cwd in (home / "projA", home / "projB", home / "z", home, tmp_path, Path("/")):
        monkeypatch.chdir(cwd)
        assert source_for(a) == "~/projA/CLAUDE.md", cwd
        assert source_for(b) == "~/projB/CLAUDE.md", cwd
        assert source_for(srv) == f"{tmp_path}/srv/docs/notes.md", cwd  # outside home
        assert source_for(tmp_path / "srv-link" / "docs" / "notes.md") == source_for(srv)
    monkeypatch.chdir(home / "projA")
    assert source_for(Path("CLAUDE.md")) == "~/projA/CLAUDE.md"
    assert source_for(Path("../projA/./CLAUDE.md")) == "~/projA/CLAUDE.md"
    # --source-prefix takes the place of ~ or /, as of a repository's name
    assert source_for(a, prefix="team") == "team/projA/CLAUDE.md"
    assert source_for(srv, prefix="team") == f"team{tmp_path}/srv/docs/notes.md"
    assert source_for(a, prefix="") == "projA/CLAUDE.md"
    assert source_for(a, home / "projA") == "CLAUDE.md"  # an explicit root wins


def test_source_in_a_git_work_tree_names_the_repository(tmp_path, monkeypatch):
    repo = tmp_path / "shop-backend"
    (repo / ".git").mkdir(parents=True)
    nested = write(repo / "docs" / "AGENTS.md", "x")
    for cwd in (tmp_path, repo, repo / "docs", tmp_path.parent):
        monkeypatch.chdir(cwd)
        assert source_for(nested) == "shop-backend/docs/AGENTS.md"
    monkeypatch.chdir(repo / "docs")
    assert source_for(Path("../docs/AGENTS.md")) == "shop-backend/docs/AGENTS.md"
    assert source_for(Path("AGENTS.md"), prefix="billing") == "billing/docs/AGENTS.md"
    assert source_for(Path("AGENTS.md"), prefix="") == "docs/AGENTS.md"
    assert source_for(nested, repo / "docs") == "AGENTS.md"  # an explicit root wins


def test_linked_worktree_or_submodule_counts_as_a_repository(tmp_path):
    (tmp_path / "vendor" / "lib").mkdir(parents=True)
    write(tmp_path / "vendor" / "lib" / ".git", "gitdir: ../../.git/modules/lib\n")
    (tmp_path / ".git").mkdir()
    rules = write(tmp_path / "vendor" / "lib" / ".cursorrules", "x")
    assert source_for(rules) == "lib/.cursorrules"


def test_a_repository_with_an_origin_is_named_by_it(tmp_path):
    """QA: two repositories in folders called `api` (work and personal) shared sources, and
    importing one retired the other's memories. With an origin remote the name is the
    remote's owner/repo, the same on every teammate's machine, whatever the folder."""

    def repo(folder: str, remote: str | None) -> Path:
        root = tmp_path / folder
        root.mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        if remote:
            subprocess.run(["git", "-C", str(root), "remote", "add", "origin", remote], check=True)
        return write(root / "AGENTS.md", "x")

    work = repo("work/api", "git@github.com:acme/api.git")
    personal = repo("personal/api", "https://gitlab.com/me/hobby-api")
    local = repo("scratch/api", None)
    assert source_for(work) == "acme/api/AGENTS.md"
    assert source_for(personal) == "me/hobby-api/AGENTS.md"
    assert source_for(local) == "api/AGENTS.md"  # no remote: the folder's name
    linked = tmp_path / "api-wt"
    git = ["git", "-C", str(work.parent), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    subprocess.run([*git, "worktree", "add", "-q", "-b", "wt", str(linked)], check=True)
    assert source_for(write(linked / "AGENTS.md", "x")) == "acme/api/AGENTS.md"


def test_repositories_in_groups_that_end_alike_keep_apart(tmp_path):
    """QA: `platform/infra/terraform` and `data/infra/terraform` on one GitLab were both
    named `infra/terraform`, so importing one overwrote and retired the other's memories.
    The whole path of the remote names a repository; GitHub's owner/repo stays as it was."""

    def repo(folder: str, remote: str) -> Path:
        root = tmp_path / folder
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "remote", "add", "origin", remote], check=True)
        return write(root / "AGENTS.md", "x")

    platform = repo("a/terraform", "git@gitlab.example.com:platform/infra/terraform.git")
    data = repo("b/terraform", "git@gitlab.example.com:data/infra/terraform.git")
    assert source_for(platform) == "platform/infra/terraform/AGENTS.md"
    assert source_for(data) == "data/infra/terraform/AGENTS.md"
    https = repo("c/terraform", "https://gitlab.example.com/platform/infra/terraform/")
    assert source_for(https) == source_for(platform)  # one repository, however reached
    port = repo("d/terraform", "ssh://git@gitlab.example.com:2222/platform/infra/terraform.git")
    assert source_for(port) == source_for(platform)
    assert source_for(repo("e/api", "git@github.com:acme/api.git")) == "acme/api/AGENTS.md"
    assert source_for(repo("f/api", "../api.git")) == "api/AGENTS.md"  # never `..`


def test_a_remote_that_is_a_folder_keeps_its_last_two_parts(tmp_path):
    """Review: the whole path of a remote that is a folder (`/home/alice/src/api`) is where
    it sits on one machine: it put a teammate's name in a shared source, different on each
    machine, and renamed (`git/api` -> `srv/git/api`) what an earlier release had imported.
    A folder keeps the last two parts, as every remote did; a URL's whole path names it,
    and the name before that (for a path of more than two parts) is known to continue."""
    from relay.import_files import former_repository_name

    def repo(folder: str, remote: str) -> Path:
        root = tmp_path / folder
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "remote", "add", "origin", remote], check=True)
        return root

    for n, (remote, name, former) in enumerate(
        (
            ("/srv/git/api.git", "git/api", None),
            ("/home/alice/src/api", "src/api", None),
            ("file:///srv/git/api.git", "git/api", None),
            ("../../shared/api.git", "shared/api", None),
            ("git@github.com:acme/api.git", "acme/api", None),
            ("https://gitlab.example.com/platform/infra/tf.git", "platform/infra/tf", "infra/tf"),
            ("git@gitlab.example.com:org/project/_git/api", "org/project/_git/api", "_git/api"),
        )
    ):
        root = repo(f"r{n}/api", remote)
        assert source_for(write(root / "AGENTS.md", "x")) == f"{name}/AGENTS.md", remote
        assert former_repository_name(root) == former, remote


def test_git_says_which_missing_files_this_branch_deleted(tmp_path):
    """`relay import FOLDER` retires only the files git says this branch deleted or renamed:
    two calls for every missing file, names taken literally, and no answer (not a
    repository) said as such, so that nothing is retired on a guess."""
    from relay.import_files import NoGitAnswer, git_deleted

    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert git_deleted(repo, {"a.md"}) == set()  # no commit yet: nothing deleted
    for name in ("a.md", "b.md", "*.md", "docs/c d.md"):
        write(repo / name, "x")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    subprocess.run([*git, "mv", "a.md", "renamed.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "renamed"], check=True)
    (repo / "docs" / "c d.md").unlink()  # deleted from the work tree, not committed
    (repo / "*.md").unlink()
    missing = {"a.md", "docs/c d.md", "*.md", "never.md", "x*.md"}
    assert git_deleted(repo, missing) == {"a.md", "docs/c d.md", "*.md"}
    assert git_deleted(repo, set()) == set()
    (tmp_path / "plain").mkdir()
    with pytest.raises(NoGitAnswer, match="not a git repository"):
        git_deleted(tmp_path / "plain", {"a.md"})


def test_iter_import_files_expands_directories(tmp_path):
    for rel in [
        "README.md",
        "CLAUDE.md",
        ".cursorrules",
        "docs/guide.markdown",
        "docs/z.md",
        "docs/Upper.MD",
        "docs/notes.txt",
        ".cursor/rules/react.mdc",
        ".cursor/rules/sub/api.mdc",
        ".cursor/other.md",
        ".github/copilot-instructions.md",
        ".git/info.md",
        ".venv/lib/pkg/README.md",
        "venv/README.md",
        "node_modules/pkg/README.md",
        "web/node_modules/pkg/README.md",
        ".hidden/notes.md",
        "pkg/.secret.md",
        "pkg/__pycache__/x.md",
    ]:
        write(tmp_path / rel, "# x\ny\n")
    found = [p.relative_to(tmp_path).as_posix() for p in iter_import_files([tmp_path])]
    assert found == [
        ".cursor/rules/react.mdc",
        ".cursor/rules/sub/api.mdc",
        ".cursorrules",
        ".github/copilot-instructions.md",
        "CLAUDE.md",
        "README.md",
        "docs/Upper.MD",
        "docs/guide.markdown",
        "docs/z.md",
    ]


def test_iter_import_files_explicit_files_order_and_duplicates(tmp_path):
    a = write(tmp_path / "b" / "a.md", "a")
    txt = write(tmp_path / "notes.txt", "n")
    write(tmp_path / "b" / "c.md", "c")
    found = list(iter_import_files([txt, tmp_path / "b", a]))
    assert found == [txt, a, tmp_path / "b" / "c.md"]  # given order; each file once
    with pytest.raises(InvalidRequestError, match="no such file"):
        list(iter_import_files([tmp_path / "missing"]))


def test_symlinked_directories_are_not_followed(tmp_path):
    write(tmp_path / "docs" / "a.md", "a")
    (tmp_path / "docs" / "loop").symlink_to(tmp_path / "docs", target_is_directory=True)
    assert list(iter_import_files([tmp_path])) == [tmp_path / "docs" / "a.md"]


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [
        ("memories-backup.jsonl", '{"id": "mem_1", "body": "x"}\n', "JSON lines"),
        ("events.ndjson", '{"a": 1}\n', "JSON lines"),
        ("settings.json", '{"a": 1}\n', "JSON"),
        ("people.csv", "name,team\nana,payments\n", "CSV"),
        ("people.tsv", "name\tteam\nana\tpayments\n", "TSV"),
        ("config.yaml", "# settings\nretries: 3\n", "YAML"),
        ("backup.txt", '{"id": "mem_1"}\n\n{"id": "mem_2"}\n', "JSON lines"),
        ("dump", '[{"id": "mem_1"},\n {"id": "mem_2"}]\n', "JSON"),
    ],
)
def test_structured_data_named_explicitly_is_refused(tmp_path, name, text, kind):
    """QA: `relay import memories-backup.jsonl` made 'Part 1'/'Part 2' memories of raw
    JSONL for everyone, restricted memories included."""
    path = write(tmp_path / name, text)
    with pytest.raises(InvalidRequestError) as refused:
        list(iter_import_files([write(tmp_path / "AGENTS.md", "# a\nb\n"), path]))
    message = refused.value.message
    assert message.startswith(f"{path} holds {kind}, which relay import would mangle")
    assert "Markdown" in message and ".cursorrules" in message and ".mdc" in message
    assert message.endswith("nothing was imported") and "\n" not in message


def test_plain_text_named_explicitly_is_still_read_as_markdown(tmp_path):
    files = [
        write(tmp_path / "CONVENTIONS.txt", "Use black.\n"),
        write(tmp_path / ".windsurfrules", "- Use black.\n- Use ruff.\n"),
        write(tmp_path / "links.md", "[guide](docs/guide.md) explains the layout.\n"),
        write(tmp_path / "empty.txt", ""),
    ]
    assert list(iter_import_files(files)) == files
    assert [d.body for d in drafts_from_path(files[0], tmp_path)] == ["Use black."]


def test_a_walked_markdown_file_that_holds_json_lines_is_refused(tmp_path):
    write(tmp_path / "docs" / "a.md", "# a\nb\n")
    write(tmp_path / "docs" / "backup.md", '{"id": "mem_1"}\n{"id": "mem_2"}\n')
    with pytest.raises(InvalidRequestError, match="backup.md holds JSON lines"):
        list(iter_import_files([tmp_path / "docs"]))


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("body", ["x", "line\u2028separator\u2029and\x85NEL"])
def test_an_export_file_points_to_relay_restore(tmp_path, count, body):
    """QA: an export (written by an older release) holding U+2028 raw, renamed backup.txt,
    was imported as Markdown: one memory of raw export JSON, restricted bodies, for all."""
    memory = {"id": "mem_1", "revision": 1, "body": body, "audiences": ["payments"]}
    lines = [json.dumps(memory, ensure_ascii=False)] * count
    path = write(tmp_path / "backup.txt", "\n".join(lines) + "\n")
    with pytest.raises(InvalidRequestError) as refused:
        list(iter_import_files([path]))
    assert refused.value.message.startswith(
        f"{path} is a relay export file: restore it with `relay restore {path}`; relay import"
        " reads Markdown"
    )


def test_a_folder_walk_takes_regular_files_only(tmp_path):
    """QA: a FIFO named fifo.md in a folder made the import wait for ever (Ctrl-C: 'aborted')."""
    good = write(tmp_path / "docs" / "a.md", "# a\nb\n")
    os.mkfifo(tmp_path / "docs" / "fifo.md")
    (tmp_path / "docs" / "gone.md").symlink_to(tmp_path / "nowhere.md")
    assert list(iter_import_files([tmp_path / "docs"])) == [good]


def test_a_folder_walk_in_a_git_work_tree_leaves_out_what_git_ignores(tmp_path):
    """QA: inside a git work tree a folder's walk read every file, so build copies, vendored
    rule files and personal notes git ignores became team memory. It reads what git does
    not ignore: tracked files, and untracked ones no rule matches, each repository (a
    submodule, a clone inside) by its own rules; names with spaces and accents as git
    gives them. A path named is taken as named, a folder git ignores as a whole too."""
    from relay.import_files import GitIgnored

    def git(repo: Path, *args: str) -> None:
        who = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always"]
        subprocess.run(["git", "-C", str(repo), *who, *args], check=True, capture_output=True)

    library = tmp_path / "library"
    subprocess.run(["git", "init", "-q", str(library)], check=True)
    write(library / ".gitignore", "generated.md\n")
    write(library / "README.md", "# Library\n")
    git(library, "add", ".")
    git(library, "commit", "-q", "-m", "library")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    write(repo / ".gitignore", "build/\ndist/\n*.local.md\nvendor/\n")
    for rel in (
        "AGENTS.md",
        "build/docs/README.md",  # a build's copy
        "dist/CHANGES.md",  # tracked, though its folder is ignored: never ignored
        "dist/README.md",
        "docs/notes.local.md",
        "sp ace/é/ünï code.md",
        "sp ace/é/x.local.md",
        "vendor/rules/.cursorrules",  # a clone inside an ignored folder
        "tools/README.md",  # a clone inside, not ignored: its own rules
        "tools/scratch.md",
    ):
        write(repo / rel, "# x\ny\n")
    subprocess.run(["git", "init", "-q", str(repo / "vendor" / "rules")], check=True)
    subprocess.run(["git", "init", "-q", str(repo / "tools")], check=True)
    write(repo / "tools" / ".gitignore", "scratch.md\n")
    git(repo, "add", ".gitignore", "AGENTS.md")
    git(repo, "add", "-f", "dist/CHANGES.md")
    git(repo, "submodule", "add", "-q", str(library), "lib")
    write(repo / "lib" / "generated.md", "# Generated\n")  # ignored by the submodule's rules

    ignored = GitIgnored()
    found = [p.relative_to(repo).as_posix() for p in iter_import_files([repo], ignored)]
    assert found == [
        "AGENTS.md",
        "dist/CHANGES.md",
        "lib/README.md",
        "sp ace/é/ünï code.md",
        "tools/README.md",
    ]
    assert sorted(p.relative_to(repo).as_posix() for p in ignored.skipped.values()) == [
        "build",
        "dist/README.md",
        "docs/notes.local.md",
        "lib/generated.md",
        "sp ace/é/x.local.md",
        "tools/scratch.md",
        "vendor",
    ]
    assert ignored.covers(repo / "vendor" / "rules" / ".cursorrules")
    assert not ignored.covers(repo / "dist" / "CHANGES.md")
    assert (ignored.named, ignored.unsure) == ([], {})

    # Named, a file or a folder git ignores as a whole is taken; each is said.
    named = GitIgnored()
    notes, build = repo / "docs" / "notes.local.md", repo / "build"
    assert list(iter_import_files([notes, build], named)) == [notes, build / "docs" / "README.md"]
    assert named.named == [notes, build]
    # Without an answer from git (not a repository after all) the folder is read whole.
    (tmp_path / "fake" / ".git").mkdir(parents=True)
    write(tmp_path / "fake" / "a.md", "# a\n")
    unsure = GitIgnored()
    assert list(iter_import_files([tmp_path / "fake"], unsure)) == [tmp_path / "fake" / "a.md"]
    assert "not a git repository" in unsure.unsure[tmp_path / "fake"]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "---\n\nAlways run the tests before pushing.\n\n---\n\n# Deploy\n\nmake deploy\n",
            id="paragraph-between-rules",
        ),
        pytest.param("---\n- use ruff\n- test first\n---\n# Deploy\n\nmake deploy\n", id="list"),
        pytest.param(
            "---\ntitle: Notes\nSee the wiki first.\n---\n# Deploy\n\nmake deploy\n",
            id="key-then-text",
        ),
    ],
)
def test_text_between_opening_rules_is_not_front_matter(text):
    # A Markdown file may open with a `---` rule: what sits between it and the next one is
    # text to import, not front matter to drop (it was lost without a word).
    assert split_front_matter(text) == ({}, text)
    bodies = [d.body for d in drafts_from_text(text, "CLAUDE.md")]
    assert bodies[-1] == "make deploy"
    assert len(bodies) == 2


def test_a_page_break_or_vertical_tab_is_a_line_break_not_a_refused_import():
    """QA: one form feed (^L, a page break in an older text file) in any file refused the
    whole import, the server refusing control characters in a body."""
    text = "# Printing\n\nPage one.\fPage two.\vstill page two.\n\f\nPage three.\f\n"
    (draft,) = drafts_from_text(text, "docs/printing.md")
    # a page break on its own line or at a line's end reads as before (stripped there)
    assert draft.body == "Page one. Page two. still page two.\n\nPage three."
    assert check_body(draft.body) == draft.body  # what the server takes, as it is


def test_a_control_character_is_replaced_where_it_stood_and_recorded():
    """QA: one NUL or ESC (a terminal colour pasted into a runbook) in any file refused the
    whole import. It is replaced by U+FFFD, visibly, in that section alone, and the draft
    records what was replaced for the import to say; the other sections are untouched."""
    text = (
        "---\ndescription: Colours\x07\nglobs: src/\x1b*.py\n---\n"
        "# Errors \x1b[31mred\x1b[0m\nRun\x00 it.\n# Clean\nNothing odd.\n"
    )
    first, clean = drafts_from_text(text, "rules.mdc", rules=True)
    assert (first.title, first.body, first.tags) == (
        "Colours\ufffd › Errors \ufffd[31mred\ufffd[0m",
        "Run\ufffd it.",
        ("glob:src/\ufffd*.py",),
    )
    assert sorted(first.replaced) == ["\x00", "\x07", "\x1b", "\x1b", "\x1b"]
    assert (clean.title, clean.body) == ("Colours\ufffd › Clean", "Nothing odd.")
    assert sorted(clean.replaced) == ["\x07", "\x1b"]  # the description and glob it shares
    for draft in (first, clean):
        assert check_body(draft.body) == draft.body and check_title(draft.title) == draft.title
    assert drafts_from_text("# A\nPlain.\n", "a.md")[0].replaced == ()


def test_a_control_character_python_reads_as_space_is_replaced_and_recorded_too():
    """QA: 0x1C-0x1F (and NEL, 0x85) are whitespace to Python's split and strip: at a
    line's end one was dropped and in a heading one became a space, without a word, where
    every other control character becomes U+FFFD and is said. Now they do the same,
    wherever they stand, and a section's id is that of its text as written."""
    text = (
        "---\ndescription: Ops\x1c\nglobs: src/\x1d*.py\n---\n"
        "# Ro\x1fll\x1cback\x1e\nRevert\x1d the tag.\x1f\n\x85\n# Clean\nNothing\x85 odd.\n"
    )
    first, clean = drafts_from_text(text, "rules.mdc")
    assert (first.title, first.body, first.tags) == (
        "Ops\ufffd › Ro\ufffdll\ufffdback\ufffd",
        "Revert\ufffd the tag.\ufffd\n\ufffd",
        ("glob:src/\ufffd*.py",),
    )
    assert sorted(first.replaced) == sorted("\x1c\x1d\x1f\x1c\x1e\x1d\x1f\x85")
    assert (clean.title, clean.body) == ("Ops\ufffd › Clean", "Nothing\ufffd odd.")
    assert sorted(clean.replaced) == ["\x1c", "\x1d", "\x85"]
    for draft in (first, clean):
        assert check_body(draft.body) == draft.body and check_title(draft.title) == draft.title
    assert first.id == draft_id("rules.mdc", ("Ro\x1fll\x1cback\x1e",))
    # the code points standing in while the file is parsed are never the file's own
    mine = "# A\U000f0002\x1f\nText \U000f0000 and \U000f0001.\x1e\n"
    (draft,) = drafts_from_text(mine, "a.md")
    assert (draft.title, draft.body) == (
        "A\U000f0002\ufffd",
        "Text \U000f0000 and \U000f0001.\ufffd",
    )


def test_a_file_of_nuls_is_not_text(tmp_path):
    """A UTF-16 file without a byte-order mark reads as UTF-8 with a NUL every other
    character: not a few stray control characters to replace, but no UTF-8 text."""
    path = tmp_path / "notes.md"
    path.write_bytes("# Notes\nWritten by a Windows tool.\n".encode("utf-16-le"))
    with pytest.raises(InvalidRequestError, match=r"is not UTF-8 text \(one character in 2 is"):
        drafts_from_path(path, tmp_path)
