"""relay.json_text: a settings file rewritten in its own layout, and JSON with comments named."""

from __future__ import annotations

import copy
import json
import random

import pytest

from relay import agents
from relay.json_text import jsonc_extras, render

SCRIPT = "/home/me/.relay/relay-autosearch-hook.sh"


def test_a_new_file_is_two_spaces_a_level_and_ends_in_a_newline():
    assert render({"a": {"b": [1]}}) == '{\n  "a": {\n    "b": [\n      1\n    ]\n  }\n}\n'


def test_a_lone_surrogate_written_anew_stays_an_escape():
    """ "\\ud800" is valid JSON and has no UTF-8: written raw, the file could not be saved."""
    text = render({"env": {"L": "\ud800", "é": "\u2028"}})
    assert (
        text.encode()
        == b'{\n  "env": {\n    "L": "\\ud800",\n    "\xc3\xa9": "\xe2\x80\xa8"\n  }\n}\n'
    )


@pytest.mark.parametrize(
    ("like", "expected"),
    [
        # tabs and CRLF line ends; the empty object at the root opens onto lines
        ('{\r\n\t"a": 1\r\n}', '{\r\n\t"a": 1,\r\n\t"b": [\r\n\t\t2\r\n\t]\r\n}'),
        ("{}\n", '{\n  "b": [\n    2\n  ]\n}\n'),
        # one line stays one line, minified stays minified
        ('{"a": 1}', '{"a": 1, "b": [2]}'),
        ('{"a":1}', '{"a":1,"b":[2]}'),
        # a key and its value spaced as the file spaces them
        ('{\n   "a" : 1\n}', '{\n   "a" : 1,\n   "b" : [\n      2\n   ]\n}'),
    ],
)
def test_what_is_added_is_laid_out_as_the_file_is(like, expected):
    doc = {**json.loads(like), "b": [2]}
    assert render(doc, like) == expected


def test_what_goes_takes_its_separator_and_the_rest_stays_as_written():
    like = '{\n  "a": [1,   2, 3],\n  "b": {"x": 1.50, "y": "\\u00e9"},\n  "c": true\n}\n'
    assert render({"a": [1, 3], "b": {"x": 1.5, "y": "é"}, "c": True}, like) == (
        '{\n  "a": [1,   3],\n  "b": {"x": 1.50, "y": "\\u00e9"},\n  "c": true\n}\n'
    )
    assert render({"a": [1, 2, 3], "c": True}, like) == '{\n  "a": [1,   2, 3],\n  "c": true\n}\n'
    assert render({}, like) == "{}\n"


def test_a_value_of_another_kind_is_written_anew_where_the_old_one_stood():
    like = '{\n    "hooks": null,\n    "n": 1\n}'
    doc = {"hooks": {"E": []}, "n": True}
    assert render(doc, like) == '{\n    "hooks": {\n        "E": []\n    },\n    "n": true\n}'


def test_relays_hooks_added_then_taken_out_give_back_the_same_bytes():
    like = (
        '{"hooks": {\n "Stop": [{"hooks": [{"type": "command", "command": "notify"}]}],\n'
        ' "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "log"}]}]}}'
    )
    installed = render(agents.add_hooks(json.loads(like), SCRIPT), like)
    assert installed.startswith(like[: like.index("]}]}}")])
    assert render(agents.strip_hooks(json.loads(installed)), installed) == like


def _value(rng: random.Random, depth: int) -> object:
    roll = rng.random()
    if depth < 3 and roll < 0.3:
        return {f"k{rng.randrange(6)}": _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if depth < 3 and roll < 0.5:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return rng.choice([0, 1, 1.0, 1.5, True, False, None, "s", "é", "\ud800", "\u2028"])


def _grown(rng: random.Random, value: object, depth: int = 0) -> object:
    """`value` with members and elements added at the ends, as install adds its entries."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for key in list(value):
            if rng.random() < 0.4:
                value[key] = _grown(rng, value[key], depth + 1)
        if rng.random() < 0.4:
            value[f"new{rng.randrange(3)}"] = _value(rng, depth + 1)
    elif isinstance(value, list):
        value = [_grown(rng, v, depth + 1) if rng.random() < 0.3 else v for v in value]
        if rng.random() < 0.4:
            value.append(_value(rng, depth + 1))
    return value


def _changed(rng: random.Random, value: object, depth: int = 0) -> object:
    """`value` with members and elements removed, replaced, added anywhere."""
    if isinstance(value, dict):
        out = {k: _changed(rng, v, depth + 1) for k, v in value.items() if rng.random() > 0.2}
        if rng.random() < 0.3:
            out[f"n{rng.randrange(3)}"] = _value(rng, depth + 1)
        return out
    if isinstance(value, list):
        kept = [_changed(rng, v, depth + 1) for v in value if rng.random() > 0.2]
        return [_value(rng, depth + 1), *kept] if rng.random() < 0.3 else kept
    return _value(rng, depth + 1) if rng.random() < 0.3 else value


@pytest.mark.parametrize("seed", range(4))
def test_any_edit_reads_back_as_the_document_and_growth_undoes_byte_for_byte(seed):
    rng = random.Random(seed)
    layouts = [
        {"indent": 2},
        {"indent": 4},
        {"indent": "\t"},
        {},
        {"separators": (",", ":")},
        {"indent": 1, "separators": (",", " : ")},
    ]
    for _ in range(300):
        doc = {f"r{i}": _value(rng, 1) for i in range(rng.randrange(5))}
        like = json.dumps(doc, ensure_ascii=rng.random() < 0.5, **rng.choice(layouts))
        like += rng.choice(["", "\n", "  \n"])
        if rng.random() < 0.3:
            like = like.replace("\n", "\r\n")
        changed = _changed(rng, doc)
        assert json.loads(render(changed, like)) == changed  # render checks it strictly too
        grown = render(_grown(rng, doc), like)
        assert render(doc, grown) == like


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('{\n  // a note\n  "a": 1\n}', [("a comment (line 2)", "the comment")]),
        (
            '{"a": 1 /* x\n y */, "b": [1, 2,]}',
            [
                ("a comment (line 1)", "the comment"),
                ("a comma before a closing bracket (line 2)", "that comma"),
            ],
        ),
        (
            '{"a": "http://x//y /* no */",\n"b": [1,\n2,\n],\n}',
            [("commas before closing brackets (lines 3, 4)", "those commas")],
        ),
        ("[1,\n2\n,]", [("a comma before a closing bracket (line 3)", "that comma")]),
        ('{"a": 1} // end', [("a comment (line 1)", "the comment")]),
    ],
)
def test_json_with_comments_is_named_with_its_lines(text, found):
    assert jsonc_extras(text) == found


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',  # JSON
        '{"a": "// in a string", "b": "/* too */"}',
        '{\n  // a note\n  "a": 1 "b": 2\n}',  # broken beyond its comment
        '{"a": 1,, }',
        '{"a": 1 /* never closed',
    ],
)
def test_text_that_is_json_or_broken_otherwise_is_no_json_with_comments(text):
    assert jsonc_extras(text) == []
