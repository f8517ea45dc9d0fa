"""Click parameter types every command shares (`relay.cli`, `relay eval`, `relay drill`,
`relay migrate`): outside `relay.cli`, which imports those commands, so they may use them.
Numbers are read by `relay.numerals`' rules, as `relay serve`'s settings, the API's query
strings and the recall hook's config read them."""

from __future__ import annotations

import math
from typing import Any

import click

from relay.numerals import is_decimal, is_integer


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


class StrictFloat(click.FloatRange):
    """A decimal option read as digits with one point at most, a minus first allowed for its
    range to judge: click's FLOAT takes what Python's `float()` takes, so `--seconds 1_0` ran
    10 s, and `nan`, `inf`, `1e3`, ` 2` or other scripts' digits passed. Every use has a
    range (`min`, `max`, open or closed), checked and shown in --help as FloatRange does;
    digits past a float's largest value are refused, not taken as infinity."""

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, str) and not is_decimal(value):
            self.fail(
                f"{value!r} is not a valid decimal number (digits and one point at most).",
                param,
                ctx,
            )
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is too large.", param, ctx)
        return number
