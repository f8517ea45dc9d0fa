"""JSON in and out of the hook without importing `json`.

`import json` pulls in `re` and costs about 8 ms of a hook process that has
about 40 ms in all; the C accelerator `_json`, which `json` itself uses, costs
almost nothing. This module drives `_json` directly and falls back to `json`
on an interpreter that lacks it. Only plain JSON is accepted: no NaN/Infinity.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `import typing` would cost the hook a few milliseconds
if TYPE_CHECKING:
    from typing import NoReturn

_WHITESPACE = " \t\n\r"
_INFINITY = float("inf")

try:
    import _json
except ImportError:  # pragma: no cover - every CPython has _json
    _json = None  # type: ignore[assignment]


class _Context:
    """The attributes `_json.make_scanner` reads from a `json.JSONDecoder`."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name: str) -> NoReturn:
        no_constant(name)


class NotJSONNumber(ValueError):
    """A number Python's json reads that JSON has none for: args are the literal and
    whether it is one that reads as infinity (`1e400`), else a constant (NaN, Infinity)."""

    def __str__(self) -> str:
        return f"{self.args[0]} is no JSON number"


def no_constant(name: str) -> NoReturn:
    """`json.loads(parse_constant=)`: NaN and Infinity, which Python's json reads and JSON
    (JSON.parse, this hook, the MCP SDK) does not."""
    raise NotJSONNumber(name, False)


def finite(literal: str) -> float:
    """`json.loads(parse_float=)`: a number past a double's range (`1e400`) reads as
    infinity, which JSON cannot write back (Python's json writes `Infinity`)."""
    value = float(literal)
    if value in (_INFINITY, -_INFINITY):
        raise NotJSONNumber(literal, True)
    return value


# typeshed types the context as a JSONDecoder; _json reads only the attributes above.
_scan = _json.make_scanner(_Context()) if _json is not None else None  # type: ignore[arg-type]


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark


def loads(text: str | bytes) -> object:
    """Parse one JSON document; raise ValueError on anything else."""
    if isinstance(text, bytes | bytearray):
        # One leading byte-order mark is skipped: some Windows shells and agents write one
        # before the JSON they pipe, and editors such as Notepad save config files with it.
        text = text.removeprefix(BOM).decode("utf-8")  # UnicodeDecodeError is a ValueError
    if _scan is None:  # pragma: no cover
        import json

        return json.loads(text, parse_constant=_Context.parse_constant)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"invalid JSON at offset {exc.value}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except SystemError:
        # An unterminated string: `_json` builds that error from `json.decoder`, which this
        # process never imported, and fails with a SystemError instead.
        raise ValueError("invalid JSON: unterminated string") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"extra data at offset {end}")
    return value


def dumps(value: object) -> str:
    """Serialise dicts, lists, strings, numbers, booleans and None as compact ASCII JSON."""
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def escaped_len(text: str) -> int:
    """How many characters `text` takes in what `dumps` writes (its quotes left out): each
    newline or quote takes two, each character beyond ASCII six or twelve."""
    if _json is None:  # pragma: no cover
        import json

        return len(json.dumps(text)) - 2
    return len(_json.encode_basestring_ascii(text)) - 2


def _write(value: object, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_json.encode_basestring_ascii(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        # NaN and infinities are not JSON; nothing the hook writes needs them.
        out.append(float.__repr__(value) if value - value == 0 else "null")
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(_json.encode_basestring_ascii(str(key)))
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")
