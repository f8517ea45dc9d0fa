"""Click parameter types every command shares (`relay.cli`, `relay eval`, `relay drill`,
`relay migrate`): outside `relay.cli`, which imports those commands, so they may use them.
Numbers are read by `relay.numerals`' rules, as `relay serve`'s settings, the API's query
strings and the recall hook's config read them."""

from __future__ import annotations

from typing import Any

import click

from relay.numerals import is_integer


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
