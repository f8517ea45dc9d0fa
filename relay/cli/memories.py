"""`relay remember`, `edit`, `forget`, `history` and `search`: memories over HTTP, with the
user's key, through the same authorization as every agent."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from typing import Any

import click

from relay.cli.common import (
    client_options,
    echo_json,
)
from relay.cli_types import StrictInt
from relay.errors import InvalidRequestError


def _memory_fields(
    title, source, audiences, tags, valid_until, supersedes, pinned, not_pinned
) -> dict[str, Any]:  # noqa: ANN001
    fields: dict[str, Any] = {}
    if pinned and not_pinned:  # one --pinned/--not-pinned option let the last one win
        raise click.UsageError("give --pinned or --not-pinned, not both")
    if valid_until is not None and not valid_until.strip():
        raise click.UsageError(
            "--valid-until needs an ISO 8601 date or time, like 2027-01-31 or "
            "2027-01-31T18:00:00Z (relay edit --no-valid-until removes one)"
        )
    for name, value in (("title", title), ("source", source), ("valid_until", valid_until)):
        if value is not None:
            fields[name] = value
    for name, value in (("audiences", audiences), ("tags", tags), ("supersedes", supersedes)):
        if value:
            fields[name] = list(value)
    if pinned or not_pinned:
        fields["pinned"] = bool(pinned)
    return fields


def memory_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The fields of a new memory."""
    return _memory_options(fn, "default all")


def edit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same fields for an edit: each one given replaces the memory's, the rest stay;
    a --no-FIELD flag, listed after its field, removes a list or the end date."""
    return _memory_options(fn, "replaces its audiences; kept if not given", clears=True)


def _clear_option(field: str, help_text: str) -> Callable[..., Any]:
    return click.option(
        f"--no-{field.replace('_', '-')}", f"clear_{field}", is_flag=True, help=help_text
    )


def _memory_options(
    fn: Callable[..., Any], audience_default: str, clears: bool = False
) -> Callable[..., Any]:
    options = [
        click.option("--title", help="Short title, one line."),
        click.option("--source", help="Provenance, path-like (e.g. team/infra/clusters)."),
        click.option(
            "--audience",
            "audiences",
            multiple=True,
            help=f"Role allowed to see it (repeatable; {audience_default}).",
        ),
        click.option(
            "--tag",
            "tags",
            multiple=True,
            help="Tag (repeatable"
            + ("; replaces its tags; kept if not given)." if clears else ")."),
        ),
        clears and _clear_option("tags", "Remove all its tags."),
        click.option(
            "--valid-until",
            help="ISO 8601 date or date-time after which recall (search, hook, MCP) never"
            " returns it; one without an offset is UTC (2027-01-31, 2027-01-31T18:00:00+02:00).",
        ),
        clears
        and _clear_option(
            "valid_until",
            "Remove its valid_until: it has no end date, and recall returns it again.",
        ),
        click.option(
            "--supersedes", multiple=True, help="Id of a memory this one replaces (repeatable)."
        ),
        clears
        and _clear_option(
            "supersedes",
            "Remove its supersedes links (links to memories this key cannot read stay).",
        ),
        click.option(
            "--pinned", is_flag=True, help="Part of the team profile shown at session start."
        ),
        click.option(
            "--not-pinned",
            is_flag=True,
            help="Not part of the team profile"
            + (" (takes it out)." if clears else " (the default)."),
        ),
    ]
    for opt in reversed([o for o in options if o]):
        fn = opt(fn)
    return fn


def _memory_path(memory_id: str, rest: str = "") -> str:
    from relay.client import memory_path  # imported when used: the CLI starts light

    return memory_path(memory_id, rest)


def _read_body(body: str | None) -> str | None:
    if body != "-":
        return body
    raw = sys.stdin.buffer.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(
            f"stdin is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None


@click.command()
@click.argument("body")
@memory_options
@click.option("--json", "as_json", is_flag=True, help="Print the stored memory as JSON.")
@client_options
def remember(client, body: str, as_json: bool, **opts: Any) -> None:  # noqa: ANN001
    """Add a memory (BODY, or - to read it from stdin)."""
    memory = client.post("/v1/memories", {"body": _read_body(body), **_memory_fields(**opts)})
    if as_json:
        echo_json(memory)
    else:
        click.echo(f"remembered {memory['id']} (revision {memory['revision']})")
    _warn(memory)


def _warn(answer: dict[str, Any]) -> None:
    """What the server warns of in a write's answer (`warnings`: this key cannot read the
    memory any more), on stderr, whatever the output's format."""
    for warning in answer.get("warnings") or []:
        click.echo(f"relay: warning: {warning}", err=True)


@click.command()
@click.argument("memory_id")
@click.option("--body", help="New text (or - for stdin).")
@edit_options
@click.option(
    "--expected-revision",
    type=StrictInt(min=1),
    help="Fail if the memory moved on meanwhile.",
)
@client_options
def edit(
    client,  # noqa: ANN001
    memory_id: str,
    body: str | None,
    expected_revision: int | None,
    clear_valid_until: bool,
    clear_tags: bool,
    clear_supersedes: bool,
    **opts: Any,
) -> None:
    """Edit a memory: every edit that changes something is a new revision (one that
    changes nothing makes none, and says so). A field not given keeps its value;
    --title "" and --source "" remove them, --no-tags, --no-supersedes and --no-valid-until
    remove those. The key needs memory:read as well as memory:write. A deleted memory
    cannot be edited: that is said with when it was deleted, and exits 4."""
    fields = _memory_fields(**opts)
    # (field, its --no- flag's value, the option that sets it)
    cleared = (
        ("valid_until", clear_valid_until, "--valid-until"),
        ("tags", clear_tags, "--tag"),
        ("supersedes", clear_supersedes, "--supersedes"),
    )
    for name, clear, option in cleared:
        if not clear:
            continue
        if name in fields:
            raise click.UsageError(f"give {option} or --no-{name.replace('_', '-')}, not both")
        fields[name] = None  # null clears it (docs/http-api.md, PATCH)
    if body is not None:
        fields["body"] = _read_body(body)
    if expected_revision is not None:
        fields["expected_revision"] = expected_revision
    if not fields:
        raise click.UsageError("nothing to change: pass --body or another field")
    from relay.client import deleted_at
    from relay.errors import NotFoundError

    # Read first: the server answers an edit that changes nothing with the memory as it was.
    before = _read(client, memory_id)
    try:
        memory = client.request("PATCH", _memory_path(memory_id), fields)
    except NotFoundError:  # 'no memory': say so of one deleted, as history shows it
        tombstone = _deletion(client, memory_id)
        if tombstone is None:
            raise
        raise NotFoundError(
            f"{deleted_at(memory_id, tombstone)}: a deleted memory cannot be edited"
            " (relay remember records a new one)"
        ) from None
    if before is not None and memory["revision"] == before["revision"]:
        click.echo(f"unchanged: {memory['id']} is still at revision {memory['revision']}")
    else:
        click.echo(f"{memory['id']} is now at revision {memory['revision']}")
    _warn(memory)


@click.command()
@click.argument("memory_id")
@click.option(
    "--expected-revision",
    type=StrictInt(min=1),
    help="Fail, deleting nothing, if the memory moved on from this revision meanwhile.",
)
@client_options
def forget(client, memory_id: str, expected_revision: int | None) -> None:  # noqa: ANN001
    """Delete a memory everywhere at once (its history keeps a tombstone, not the text).
    A memory it superseded comes back into recall, unless another still supersedes it:
    each that does is named. A memory already deleted is said to be, with when, and exits
    0 as a deletion does (a script may forget twice); an id this key knows no memory by
    exits 4."""
    from relay.client import back_in_recall, deleted_at
    from relay.client import forget as forget_memory
    from relay.errors import NotFoundError

    at = "" if expected_revision is None else f"?expected_revision={expected_revision}"
    try:
        back = forget_memory(
            memory_id,
            lambda target: client.get(_memory_path(target)),
            lambda: client.request("DELETE", _memory_path(memory_id, at)),
        )
    except NotFoundError:
        tombstone = _deletion(client, memory_id)
        if tombstone is None:
            raise
        click.echo(f"already deleted: {deleted_at(memory_id, tombstone)}")
        return
    click.echo(f"forgot {memory_id}" + (f"; {back_in_recall(back)}" if back else ""))


def _read(client, memory_id: str) -> dict[str, Any] | None:  # noqa: ANN001
    """The memory as this key reads it; None when gone or not for this key to read."""
    from relay.client import readable

    return readable(lambda target: client.get(_memory_path(target)), memory_id)


def _deletion(client, memory_id: str) -> dict[str, Any] | None:  # noqa: ANN001
    """The tombstone ending a deleted memory's history (`relay.client.deletion`)."""
    from relay.client import deletion

    return deletion(lambda: client.get(_memory_path(memory_id, "/revisions"))["items"])


def _current(memory: dict[str, Any]) -> bool:
    """Not past its valid_until: recall returns it."""
    from relay.client import expired

    return not expired(memory.get("valid_until"))


@click.command()
@click.argument("memory_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@client_options
def history(client, memory_id: str, as_json: bool) -> None:  # noqa: ANN001
    """Show every revision of a memory, and whether recall leaves it out: expired, or
    superseded (by which memory)."""
    answer = client.get(_memory_path(memory_id, "/revisions"))
    items = answer["items"]
    if as_json:
        echo_json(items)
        return
    before: dict[str, Any] = {"pinned": False}  # the last revision shown whole
    for r in items:
        if r.get("withheld"):
            text = "(withheld: written for audiences this key cannot read)"
        else:
            text = r["body"] if r["body"] is not None else "(deleted: text removed)"
        head = f"rev {r['revision']}  {r['action']:<6} {r['recorded_at']}"
        if r["title"]:  # else no title: nothing, not a blank field closing the line
            head += f"  {r['title']}"
        # Every line of the body indented as its first (a blank one left empty, not spaces).
        click.echo(f"{head}\n{textwrap.indent(text, '    ')}")
        if r.get("withheld") or r["action"] == "delete":
            continue
        # What else this revision changed: an edit of a tag, a date or the pin is a revision too.
        changed = [
            f"{name}: {_shown(r.get(name))}"
            for name in _HISTORY_FIELDS
            if r.get(name) != before.get(name, [] if isinstance(r.get(name), list) else None)
        ]
        pin, was = r.get("pinned"), before.get("pinned")
        if pin is not None and was is not None and pin != was:
            changed.append("pinned" if pin else "unpinned")
        elif pin is None and not changed and _alike(before, r):
            # Recorded before revisions kept the pin: nothing else changes, so the pin did.
            changed.append("pinned or unpinned: recorded before revisions said which")
        if changed:
            click.echo("    (" + "; ".join(changed) + ")")
        before = r
    last = items[-1] if items else {}
    if not last.get("withheld") and last.get("action") != "delete" and not _current(last):
        click.echo(
            f"expired at {last['valid_until']}: recall no longer returns this memory"
            f" ('relay edit {memory_id} --valid-until DATE' or '--no-valid-until' brings it back)"
        )
    if answer.get("superseded_by"):  # an older server does not say
        replaced = answer["superseded_by"]
        click.echo(
            f"superseded by {replaced}: recall no longer returns this memory"
            f" ('relay history {replaced}' shows what replaced it)"
        )


_HISTORY_FIELDS = ("source", "audiences", "tags", "valid_until", "supersedes")


def _alike(before: dict[str, Any], r: dict[str, Any]) -> bool:
    """Whether revision `r` holds what the one right before it, `before`, holds in every
    field shown: an edit that changes none of them changed the pin (one that changes
    nothing makes no revision)."""
    return before.get("revision") == r["revision"] - 1 and all(
        before.get(name) == r.get(name)
        for name in ("title", "body", "supersedes_withheld", *_HISTORY_FIELDS)
    )


def _shown(value: Any) -> str:
    if value is None or value == []:
        return "none"
    return ", ".join(value) if isinstance(value, list) else str(value)


@click.command()
@click.argument("query")
@click.option("-k", "k", default=5, show_default=True, type=StrictInt(1, 12), help="Results.")
@click.option(
    "--mode",
    type=click.Choice(["hybrid", "lexical", "semantic"]),
    default="hybrid",
    show_default=True,
    help="Ranking signals to use.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw response.")
@client_options
def search(client, query: str, k: int, mode: str, as_json: bool) -> None:  # noqa: ANN001
    """Search team memory through the server's pipeline, as the recall hook does.

    Lists everything the server returns above its threshold; the hook then injects at
    most its max_records of these, scoring at least its min_score (docs/hook.md)."""
    response = client.post(
        "/v1/search", {"query": query, "k": k, "mode": mode, "deadline_ms": 2000}
    )
    if as_json:
        echo_json(response)
        return
    from relay.client import search_records

    records = search_records(response)
    if not records:
        click.echo("nothing relevant")
    for r in records:
        score = "[-]" if r["score"] is None else f"[{r['score']:.2f}]"
        head = f"{score} {r['id']} rev {r['revision']}  {r['source']}"
        click.echo(f"{head}  {r['title']}\n    {r['text']}")
