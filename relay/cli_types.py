"""Click parameter types every command shares (`relay.cli`, `relay eval`, `relay drill`,
`relay migrate`): outside `relay.cli`, which imports those commands, so they may use them.
`relay serve`'s settings (`relay.settings.whole`, a flag or a variable) and the API's query
strings (`relay.api_requests.QueryInt`) read integers by the same rule, `is_integer`."""

from __future__ import annotations

import re
from typing import Any

import click

_INTEGER = re.compile(r"-?[0-9]+")


def is_integer(text: str) -> bool:
    """Whether `text` is an integer as Relay reads one: decimal digits alone, a minus first
    allowed (a range then judges it). Python's `int()` also takes `1_0`, `+3`, ` 2 ` and
    other scripts' digits."""
    return _INTEGER.fullmatch(text) is not None


class StrictInt(click.IntRange):
    """An integer option read as decimal digits alone, a minus first allowed for its range to
    judge (the rule of the API's query strings): click's INT takes what Python's
    `int()` takes, so `--expected-revision 1_0` sent revision 10, and ` 2` or `+3` passed.
    A range (`min`, `max`) is checked as IntRange checks it, and shown so in --help."""

    def __init__(self, min: int | None = None, max: int | None = None) -> None:
        super().__init__(min, max)
        if min is None and max is None:
            self.name = "integer"  # --help's INTEGER, not INTEGER RANGE

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, str) and not is_integer(value):
            self.fail(f"{value!r} is not a valid integer (decimal digits only).", param, ctx)
        return super().convert(value, param, ctx)

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()
