"""How Relay reads a number written as text, wherever it is typed: the CLI's options
(`relay.cli_types`), `relay serve`'s settings, the API's query strings, and the recall hook's
config file and RELAY_* variables (`relay.hook.config`). Python's `int()` and `float()` also
take `1_0`, `+3`, ` 2 `, other scripts' digits, and `float()` `nan`, `inf` and
`1e3`: a typo or a stray character there became another number, silently.

Imports nothing: the hook imports it on every prompt."""


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit() alone takes `٤` and `²`


def is_integer(text: str) -> bool:
    """Whether `text` is an integer as Relay reads one: decimal digits alone, a minus first
    allowed (a range then judges it)."""
    return _digits(text.removeprefix("-"))


def is_decimal(text: str) -> bool:
    """Whether `text` is a decimal number as Relay reads one: decimal digits with one point
    at most (`0.3`, `.5`, `15`), a minus first allowed (a range then judges it); no
    exponent, no `nan` or `inf`."""
    whole, _, fraction = text.removeprefix("-").partition(".")
    parts = [part for part in (whole, fraction) if part]
    return bool(parts) and all(map(_digits, parts))
