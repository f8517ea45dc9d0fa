"""The knob script read as it runs: what it hands the hook, and what it execs."""

from __future__ import annotations

import subprocess

import pytest
from integration_support import old_script

from relay import knob_script
from relay.knob_script import hook_script

HOOK = "/opt/relay/.venv/bin/relay-hook"
TEMPLATE = hook_script(HOOK)
# bash, macOS's sh, reads a here-document otherwise than dash might: both are checked.
SHELLS = (["/bin/sh"], ["/bin/bash", "--posix"])


def edited(old: str, new: str, text: str = TEMPLATE) -> str:
    assert old in text
    return text.replace(old, new)


def test_the_installed_template_reads_back_whole():
    reading = knob_script.read(TEMPLATE)
    assert (reading.data, reading.guarded, reading.closed) == (True, True, True)
    assert reading.hook == HOOK
    assert {k.var: k.value for k in reading.knobs} == {
        "THROTTLE_PROMPTS": "2",
        "OVERLAP_THRESHOLD": "0.30",
        "MIN_PROMPT_LEN": "15",
        "DEADLINE_MS": "400",
    }
    lines = TEMPLATE.splitlines()
    assert all(lines[k.line - 1] == k.text for k in reading.knobs)
    environ = reading.handed({"RELAY_DEADLINE_MS": "700", "HOME": "/h"})
    assert environ["RELAY_DEADLINE_MS"] == "700"  # the environment beats the script
    assert environ["RELAY_MIN_PROMPT_LEN"] == "15" and environ["HOME"] == "/h"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("DEADLINE_MS=400", 'DEADLINE_MS="450'),
        ("DEADLINE_MS=400", "  DEADLINE_MS = '450'  "),
        ("DEADLINE_MS=400", "DEADLINE_MS\t450"),
        ("DEADLINE_MS=400", "DEADLINE_MS=450  # a slow laptop"),
        ("DEADLINE_MS=400", "DEADLINE_MS=$(echo 450"),
        ("DEADLINE_MS=400", "DEADLINE_MS="),
        ("DEADLINE_MS=400", "DEADLINE_MS=\nDEADLINE_MS=450"),  # an empty value is replaced
        ("DEADLINE_MS=400", "DEADLINE_MS=450\nDEADLINE_MS=500"),  # else the first one counts
        ("DEADLINE_MS=400", "DEADLIN_MS=450"),
        ("DEADLINE_MS=400", "DEADLINE_MS=450="),  # read drops a lone trailing separator
        ("DEADLINE_MS=400", "DEADLINE_MS = '450' = "),
        ("DEADLINE_MS=400", "DEADLINE_MS=4=50="),  # but not one after another
        ("DEADLINE_MS=400", "DEADLINE_MS==450"),
        ("DEADLINE_MS=400", "#DEADLINE_MS=450"),
        ("\nexec ", "\nMIN_PROMPT_LEN=99\nexec "),  # shell below the knobs, not a knob
    ],
)
def test_what_is_read_is_what_the_script_hands_the_hook(tmp_path, old, new):
    """The script here execs `env`, to show what the hook would get from each shell."""
    script = tmp_path / "relay-autosearch-hook.sh"
    script.write_text(edited(old, new, hook_script("/usr/bin/env")))
    reading = knob_script.read(script.read_text())
    for environ in ({"PATH": "/usr/bin:/bin"}, {"RELAY_DEADLINE_MS": "700"}):
        expected = {k: v for k, v in reading.handed(environ).items() if k.startswith("RELAY_")}
        for shell in SHELLS:
            run = subprocess.run([*shell, str(script)], capture_output=True, env=environ)
            got = dict(line.split("=", 1) for line in run.stdout.decode().splitlines())
            assert {k: v for k, v in got.items() if k.startswith("RELAY_")} == expected, shell


def test_a_script_from_before_the_guard_is_read_as_it_was():
    """Knobs set as shell assignments, handed over by an `export` line: each line read as
    a knob line, as the loop would read it."""
    text = edited("DEADLINE_MS=400", "DEADLINE_MS=900", old_script(HOOK))
    reading = knob_script.read(text)
    assert (reading.data, reading.guarded, reading.hook) == (False, False, HOOK)
    assert reading.handed({})["RELAY_DEADLINE_MS"] == "900"
    assert [k.line for k in reading.knobs] == [
        n for n, line in enumerate(text.splitlines(), 1) if knob_script.knob_line(line)
    ]


def test_sh_is_pointed_at_a_knob_line_only_where_knobs_are_shell():
    """sh reports an unclosed quote at the end of the file: in a script from before the
    guard the likelier line is the first knob line that is not a plain assignment."""
    text = edited("DEADLINE_MS=400", 'DEADLINE_MS="400', old_script(HOOK))
    suspect = knob_script.read(text).suspect()
    assert suspect and suspect.line == text.splitlines().index('DEADLINE_MS="400') + 1
    assert knob_script.read(old_script(HOOK) + "DEADLINE_MS=400  # ok\n").suspect() is None
    assert knob_script.read(edited("DEADLINE_MS=400", 'DEADLINE_MS="400')).suspect() is None


def test_a_script_whose_knobs_never_end_never_execs_the_hook():
    reading = knob_script.read(edited("\nKNOBS\n", "\n"))
    assert (reading.closed, reading.hook) == (False, None)
    assert reading.handed({})["RELAY_DEADLINE_MS"] == "400"


def test_sh_says_where_it_cannot_parse(tmp_path):
    script = tmp_path / "relay-autosearch-hook.sh"
    script.write_text(TEMPLATE)
    assert knob_script.syntax_error(script) is None
    for typo in (
        ("DEADLINE_MS=400", 'DEADLINE_MS="400'),
        ("MIN_PROMPT_LEN=15", "MIN_PROMPT_LEN=15)"),
    ):
        script.write_text(edited(*typo))
        assert knob_script.syntax_error(script) is None, typo  # data to sh, not shell
    text = edited("\nexec ", "\nif then\nexec ")
    script.write_text(text)
    number = text.splitlines().index("if then") + 1
    error = knob_script.syntax_error(script)
    assert error is not None and error.startswith(f"line {number}: "), error
    script.write_text(edited("DEADLINE_MS=400", 'DEADLINE_MS="400', old_script(HOOK)))
    assert knob_script.syntax_error(script) is not None  # shell, before the guard


def test_the_template_has_no_problems():
    assert knob_script.read(TEMPLATE).problems("s.sh") == []


@pytest.mark.parametrize(
    ("new", "message", "fix"),
    [
        (
            "DEADLIN_MS=900",
            "line {n} of s.sh, `DEADLIN_MS=900`, sets nothing: the script reads only "
            "THROTTLE_PROMPTS, OVERLAP_THRESHOLD, MIN_PROMPT_LEN and DEADLINE_MS",
            "write it as DEADLINE_MS=900",
        ),
        (
            "export DEADLINE_MS=900",
            "line {n} of s.sh, `export DEADLINE_MS=900`, sets nothing: the script reads only "
            "THROTTLE_PROMPTS, OVERLAP_THRESHOLD, MIN_PROMPT_LEN and DEADLINE_MS",
            "write it as DEADLINE_MS=900",
        ),
        (
            "RELAY_MAX_RECORDS=5",
            "line {n} of s.sh, `RELAY_MAX_RECORDS=5`, sets nothing: the script reads only "
            "THROTTLE_PROMPTS, OVERLAP_THRESHOLD, MIN_PROMPT_LEN and DEADLINE_MS",
            "remove it, and set max_records in config.json",
        ),
        (
            "DEADLINE_MS=900  # a slow laptop",
            "the hook ignores deadline_ms '900  # a slow laptop' from line {n} of s.sh, "
            "`DEADLINE_MS=900  # a slow laptop` (not a whole number), and takes config.json's "
            "value or its default",
            "write DEADLINE_MS=VALUE with nothing after the value (a comment goes on a line of "
            "its own), or run `relay install` to rewrite the script (knobs back to their "
            "defaults)",
        ),
        (
            "DEADLINE_MS=50",
            "the hook ignores deadline_ms '50' from line {n} of s.sh, `DEADLINE_MS=50` "
            "(outside 100..10000), and takes config.json's value or its default",
            # QA: it got the fix of a comment after the value
            "set DEADLINE_MS to a value in 100..10000, or run `relay install` to rewrite the "
            "script (knobs back to their defaults)",
        ),
        (
            "DEADLINE_MS=",
            "the hook ignores deadline_ms '' from line {n} of s.sh, `DEADLINE_MS=` (not a whole"
            " number), and takes config.json's value or its default",
            "give DEADLINE_MS a value the hook takes (this one is not a whole number), or run "
            "`relay install` to rewrite the script (knobs back to their defaults)",
        ),
    ],
)
def test_knob_lines_the_script_cannot_use_are_named(new, message, fix):
    text = edited("DEADLINE_MS=400", new)
    n = TEMPLATE.splitlines().index("DEADLINE_MS=400") + 1
    (problem,) = knob_script.read(text).problems("s.sh")
    assert (problem.line, problem.message) == (n, message.format(n=n))
    assert problem.fix == fix


def test_a_knob_the_script_already_took_is_named_as_unused():
    text = edited("DEADLINE_MS=400", "DEADLINE_MS=\nDEADLINE_MS=500\nDEADLINE_MS=600")
    n = TEMPLATE.splitlines().index("DEADLINE_MS=400") + 1
    (problem,) = knob_script.read(text).problems("s.sh")
    assert problem.message == (
        f"line {n + 2} of s.sh, `DEADLINE_MS=600`, is not used: line {n + 1} sets DEADLINE_MS "
        "first, and the script takes the first"
    )


def test_a_knob_line_outside_the_knobs_is_named_as_shell():
    text = edited("KNOBS\nexec ", "KNOBS\nDEADLINE_MS=900\nexec ")
    (problem,) = knob_script.read(text).problems("s.sh")
    assert problem.message == (
        f"line {text.splitlines().index('DEADLINE_MS=900') + 1} of s.sh, `DEADLINE_MS=900`, is "
        "not among the knobs: it is shell, and the script never hands DEADLINE_MS to the hook"
    )
    assert problem.fix == "move it among the knobs, above the `KNOBS` line"
    assert knob_script.read(text).handed({})["RELAY_DEADLINE_MS"] == "400"


@pytest.mark.parametrize(
    ("first", "problem"),
    [
        ("#!/bin/sh", None),
        ("#! /bin/sh  ", None),  # spaces around the program are no part of it
        ("#!/usr/bin/env sh", None),
        ("# no shebang: sh runs the file itself", None),
        ("#!/bin/shh", "names /bin/shh, which does not exist or is not executable"),
        ("#!/bin/sh\r", "ends in a carriage return"),
        ("#!/usr/bin/env sh\r", "so /usr/bin/env is handed 'sh\\r'"),
        ("#!", "names no program to run it"),
        ("#!sh", "names sh, not an absolute path"),
    ],
)
def test_the_shebang_is_read_as_the_kernel_reads_it(tmp_path, first, problem):
    script = tmp_path / "hook.sh"
    script.write_bytes(f"{first}\nexit 0\n".encode())
    found = knob_script.shebang_problem(script)
    assert found == problem if problem is None else problem in (found or ""), found


def test_sh_that_cannot_be_run_is_not_taken_for_parsing(tmp_path):
    script = tmp_path / "hook.sh"
    script.write_text("#!/nowhere/bash\nexit 0\n")
    assert (
        knob_script.syntax_error(script)
        == "/nowhere/bash cannot be run (No such file or directory)"
    )
