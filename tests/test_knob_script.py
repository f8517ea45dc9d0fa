"""The knob script read as sh runs it: what it hands the hook, and lines it cannot read."""

from __future__ import annotations

import pytest

from relay import knob_script
from relay.install import hook_script

HOOK = "/opt/relay/.venv/bin/relay-hook"
TEMPLATE = hook_script(HOOK)


def edited(old: str, new: str) -> str:
    assert old in TEMPLATE
    return TEMPLATE.replace(old, new)


def test_the_installed_template_reads_back_whole():
    reading = knob_script.read(TEMPLATE)
    assert reading.hook == HOOK and reading.unreadable == []
    assert {v: e.value for v, e in reading.exports.items()} == {
        "RELAY_THROTTLE_PROMPTS": "2",
        "RELAY_OVERLAP_THRESHOLD": "0.30",
        "RELAY_MIN_PROMPT_LEN": "15",
        "RELAY_DEADLINE_MS": "400",
    }
    assert all(e.env_first for e in reading.exports.values())
    environ = knob_script.hook_environ(reading, {"RELAY_DEADLINE_MS": "700", "HOME": "/h"})
    assert environ["RELAY_DEADLINE_MS"] == "700"  # the environment beats the script
    assert environ["RELAY_MIN_PROMPT_LEN"] == "15" and environ["HOME"] == "/h"


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("DEADLINE_MS=900  # a slow laptop", "900"),
        ("DEADLINE_MS='900'", "900"),
        ('DEADLINE_MS="900"', "900"),
        ("DEADLINE_MS=900; THROTTLE_PROMPTS=0", "900"),
    ],
)
def test_assignments_sh_reads_are_read(line, value):
    reading = knob_script.read(edited("DEADLINE_MS=400", line))
    assert reading.exports["RELAY_DEADLINE_MS"].value == value
    assert reading.unreadable == []


@pytest.mark.parametrize(
    ("line", "spaced"),
    [
        ("DEADLINE_MS = 900", True),
        ("DEADLINE_MS= 900", False),
        ("DEADLINE_MS=$((300+600))", False),
        ("DEADLINE_MS=$SLOW", False),
        ('[ -n "$SLOW" ] && DEADLINE_MS=900', False),
    ],
)
def test_lines_doctor_cannot_read_are_named_not_guessed(line, spaced):
    reading = knob_script.read(edited("DEADLINE_MS=400", line))
    (bad,) = reading.unreadable
    assert bad.text == line and bad.spaced is spaced
    assert bad.line == TEMPLATE.splitlines().index("DEADLINE_MS=400") + 1
    assert "RELAY_DEADLINE_MS" not in knob_script.hook_environ(reading, {})


def test_what_the_export_line_says_is_what_counts():
    """Values come from the export line, whatever the template: a literal there beats the
    environment, a knob the export line leaves out is not handed over."""
    text = edited(
        '  RELAY_DEADLINE_MS="${RELAY_DEADLINE_MS:-$DEADLINE_MS}"',
        "  RELAY_DEADLINE_MS=800 RELAY_MAX_RECORDS=5",
    ).replace('RELAY_THROTTLE_PROMPTS="${RELAY_THROTTLE_PROMPTS:-$THROTTLE_PROMPTS}" \\\n', "")
    reading = knob_script.read(text)
    environ = knob_script.hook_environ(reading, {"RELAY_DEADLINE_MS": "700"})
    assert environ["RELAY_DEADLINE_MS"] == "800" and environ["RELAY_MAX_RECORDS"] == "5"
    assert "RELAY_THROTTLE_PROMPTS" not in environ
    assert knob_script.read(TEMPLATE + "DEADLINE_MS = 9\n").unreadable == []  # after exec


def test_sh_says_where_it_cannot_parse(tmp_path):
    script = tmp_path / "relay-autosearch-hook.sh"
    script.write_text(TEMPLATE)
    assert knob_script.syntax_error(script) is None
    script.write_text(edited("MIN_PROMPT_LEN=15", "MIN_PROMPT_LEN=15)"))
    number = TEMPLATE.splitlines().index("MIN_PROMPT_LEN=15") + 1
    error = knob_script.syntax_error(script)
    assert error is not None and error.startswith(f"line {number}: "), error
    script.write_text(edited("DEADLINE_MS=400", 'DEADLINE_MS="400'))
    assert knob_script.syntax_error(script) is not None
