"""Decimal numbers typed on the command line: read by one rule (relay.numerals), as strictly
as integers (`StrictInt`, tests/test_cli_memories.py), and refused in one line naming the
option."""

from __future__ import annotations

import click
import pytest
from integration_support import relay

from relay.cli import cli
from relay.cli_types import StrictFloat

# Each is a number to Python's float(), which click's FLOAT uses.
LOOSE = ["1_0", " 10", "10 ", "+10", "\u0661\u0660", "1e1", "nan", "inf", "-inf", "0x10"]
# Typed after the value under test, a bad value click reads next: were that value taken, the
# error would name this one, and no drill runs (a soak of minutes) either way.
LAST = ("--workers", "0")


def _params(command: click.Command, path: str):  # noqa: ANN202
    ctx = click.Context(command)
    for name in command.list_commands(ctx) if isinstance(command, click.Group) else ():
        yield from _params(command.get_command(ctx, name), f"{path} {name}")
    yield from ((path, p) for p in command.params)


def test_every_decimal_option_is_strict():
    """No decimal option is left to click's FLOAT (a `type=float`, or a float default, gives
    one): each is a StrictFloat with the range its value makes sense in."""
    found = {
        f"{path} {p.name}": p.type
        for path, p in _params(cli, "relay")
        if isinstance(p.type, click.types.FloatParamType)
    }
    assert {name for name, kind in found.items() if not isinstance(kind, StrictFloat)} == set()
    bounds = {name: (kind.min, kind.min_open, kind.max) for name, kind in found.items()}
    assert bounds == {
        "relay bench search seconds": (0.1, False, None),
        "relay drill load seconds": (0, True, None),
        "relay drill load overload_seconds": (0, True, None),
        "relay drill load max_rss_growth_mib": (0, False, None),
    }


@pytest.mark.parametrize("typed", LOOSE)
def test_a_decimal_option_written_loosely_is_refused_in_one_line(tmp_path, typed):
    """QA: `relay bench search --seconds 1_0` ran 10 s a level, and `nan`, `inf`, ` 10` or
    other scripts' digits were taken: click's FLOAT reads what Python's float() reads. A
    decimal option is digits with one point at most, refused before anything runs."""
    done = relay(tmp_path, "drill", "load", "--seconds", typed, *LAST)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        f"relay: error: Invalid value for '--seconds': {typed!r} is not a valid decimal number"
        " (digits and one point at most). (see 'relay drill load --help')\n"
    )


def test_a_decimal_option_takes_digits_with_a_point_within_its_range(tmp_path):
    """What is refused: a range's bound as before, and digits past a float's largest value
    (float() reads them as infinity). What is taken: `.5`, `5.`, `0.25`, as float() reads them."""
    kind = StrictFloat(0, min_open=True)
    assert [kind.convert(text, None, None) for text in (".5", "5.", "0.25", "600")] == [
        0.5,
        5.0,
        0.25,
        600.0,
    ]
    done = relay(tmp_path, "drill", "load", "--overload-seconds", "0", *LAST)
    assert done.returncode == 2 and "0 is not in the range x>0." in done.stderr, done.stderr
    done = relay(tmp_path, "drill", "load", "--max-rss-growth-mib", "9" * 400, *LAST)
    assert done.returncode == 2 and f"'{'9' * 400}' is too large." in done.stderr, done.stderr
