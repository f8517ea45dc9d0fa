"""`relay export` and `restore`: memories out and back in bulk, over HTTP."""

from __future__ import annotations

import os
import re
import sys
import urllib.parse
from pathlib import Path
from typing import TextIO

import click

from relay.cli.common import (
    client_options,
    failed_midway,
    one_line,
    progress_bar,
    sent_unanswered,
    stop_interrupted,
    terminate_as_interrupt,
)
from relay.errors import InvalidRequestError, RelayError


@click.command()
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    default="-",
    help="File to write (default stdout); replaced only once the whole export is read.",
)
@client_options
def export(client, output: Path) -> None:  # noqa: ANN001
    """Export every memory the key may read as JSONL (relay restore reads it back).

    \b
    The first line is {"relay_export": "begin", "format": 2}, then one memory a
    line, and the last line {"relay_export": "end", "memories": N}: relay restore
    refuses a file cut short (no end line) or with lines removed or added since.

    Expired and superseded memories are included; deleted ones are not. A file is
    written beside its final name (readable by you alone) and renamed into place at
    the end: an export that fails midway leaves an earlier backup as it was. A
    symlink is written through (it stays a link); what is not a file (/dev/stdout, a
    pipe, <(...)) is written to directly."""
    if str(output) == "-":
        _export_pages(client, sys.stdout)
        return
    try:
        _export_to(client, output)
    except OSError as exc:  # a full disk, a closed pipe, a folder that is not there
        raise RelayError(f"cannot write {output}: {exc.strerror or exc}") from None


def _export_to(client, output: Path) -> None:  # noqa: ANN001
    """Write the export to `output`: a descriptor or what is not a regular file directly,
    a file atomically through any symlink to it."""
    import stat
    import tempfile

    fd = _descriptor(output)
    if fd is not None:  # the one this process holds: its mode (append) and place kept
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as fh:
            _export_pages(client, fh)
        return
    try:
        mode = os.stat(output).st_mode  # through symlinks
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        # A FIFO, a device: no file to replace, and a file renamed over one would leave
        # the FIFO's reader waiting for ever (or turn /dev/null into a file, for root).
        with open(output, "w", encoding="utf-8") as fh:
            _export_pages(client, fh)
        return
    # Beside the file itself, so that the rename never crosses file systems, and a
    # symlink stays one, the file it names replaced.
    target = Path(os.path.realpath(output))
    fd, partial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            _export_pages(client, fh)
        os.replace(partial, target)
    except BaseException:
        os.unlink(partial)
        raise


# Names of a descriptor this process holds: a file opened there again would be truncated
# (an append, `>>`, lost) or, for a pipe already read, be another reader's.
_STANDARD = {"/dev/stdout": 1, "/dev/stderr": 2}
_OWN_DESCRIPTOR = re.compile(r"/(?:dev/fd|proc/self/fd)/([0-9]+)")


def _descriptor(path: Path) -> int | None:
    """The descriptor `path` names (`/dev/stdout`, `/dev/fd/63` from `>(...)`,
    `/proc/self/fd/1`, or a symlink to one of them), else None."""
    name = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on symlinks followed
        if name in _STANDARD:
            return _STANDARD[name]
        if match := _OWN_DESCRIPTOR.fullmatch(name):
            return int(match.group(1))
        if not os.path.islink(name):
            return None
        name = os.path.normpath(os.path.join(os.path.dirname(name), os.readlink(name)))
    return None


def _export_pages(client, out: TextIO) -> None:  # noqa: ANN001
    """Every memory the key may list, one a line, between the begin line (written once the
    first page is in: a key refused leaves nothing) and the end line that counts them."""
    from relay.restore import export_begin, export_end, export_line

    cursor = None
    written = 0
    while True:
        query = "" if cursor is None else "&cursor=" + urllib.parse.quote(cursor)
        # id order, said outright: in `updated` order a memory edited meanwhile moves past it
        page = client.get("/v1/memories?limit=500&order=id" + query)
        if cursor is None:
            out.write(export_begin())
        for item in page["items"]:
            out.write(export_line(item))
        written += len(page["items"])
        cursor = page["next_cursor"]
        if not cursor:
            break
    out.write(export_end(written))


@click.command()
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
)
@click.option(
    "--allow-incomplete",
    is_flag=True,
    help="Restore what a file holds even when it is not the whole export: cut short (no"
    " end line), or lines removed or added since (a warning says so).",
)
@client_options
def restore(client, file: Path, allow_incomplete: bool) -> None:  # noqa: ANN001
    """Restore the memories of a relay export file (FILE, or - for stdin).

    \b
    Each memory is written back under its id with its title, body, source,
    audiences, tags, valid_until, supersedes and pinned, through the checks every
    write passes: the key writes only what it may, and each audience must be a role
    some live key of the organisation carries, or one the memory already has here.
    Restoring again changes nothing.
    Not carried: revision history and authorship. A memory new to the organisation
    starts at revision 1, written by this key, dated now.
    \b
    - memories already expired (or expiring within 5 minutes) are skipped and counted;
    - a memory is written after the memories of the file it supersedes; a link
      that would close a cycle of supersedes links (which the server refuses, as a
      cycle would hide every memory in it) is dropped and counted;
    - a supersedes link to a memory neither in the file nor readable with this key
      here (deleted since, or outside the exporting key's audiences) is dropped and
      counted, unless the server shows that link, which is then kept; the server
      keeps the links it holds to memories this key cannot read without showing them,
      so where it says a memory has such links, a link of the file it does not show
      is counted as left to the server instead;
    - a malformed line stops the restore, naming it, before anything is written,
      as does a line without one of the fields above (null, [] or false for
      none: a field left out would be written as its default);
    - so does a file that is not the whole export: cut short (its end line
      missing: a partial copy, a disk full while exporting) or with lines
      removed or added since (the end line counts them); --allow-incomplete
      restores what it holds. A file by an older release has no begin and end
      lines: it is restored, with a warning that its completeness is unchecked;
    - it also stops at a memory deleted here since (deleted ids are never reused) or
      held here for audiences this key lacks, and at a batch the server refuses (an
      unknown audience): the batches before stay written, and running the restore
      again once fixed finishes it."""
    from relay.restore import RestoreTally, read_export, restore_memories

    name = "<stdin>" if str(file) == "-" else str(file)
    try:
        text = sys.stdin.read() if name == "<stdin>" else file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidRequestError(f"{name} is not UTF-8 text") from None
    export = read_export(text, name, allow_incomplete)
    if export.unchecked:
        click.echo(one_line(f"relay: warning: {export.unchecked}"), err=True)
    memories = export.memories
    tally = RestoreTally()

    def done(exc: BaseException | None = None) -> str:
        """How far it got, in counts that add up to the file's: restored, expired and
        skipped, and not restored yet (of which those sent the server may still write)."""
        restored = tally.written + tally.unchanged
        said = [
            f"{restored} of the file's {len(memories)} memories restored ({tally.written} new"
            f" or changed, {tally.unchanged} unchanged)"
        ]
        if tally.expired:
            said.append(f"{tally.expired} expired skipped")
        if left := len(memories) - restored - tally.expired:
            sent = sent_unanswered(tally.in_flight, exc)
            said.append(
                f"{left} not restored yet"
                + (f" ({sent} of them sent, which the server may still write)" if sent else "")
            )
        return ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]

    try:
        with terminate_as_interrupt(), progress_bar(len(memories), "restoring") as bar:
            restore_memories(client, memories, name, bar.update, tally=tally)
    except KeyboardInterrupt:
        stop_interrupted(done(), "restore")
    except RelayError as exc:
        if sent_unanswered(tally.in_flight, exc) or tally.written or tally.unchanged:
            raise failed_midway(exc, done(exc), "restore") from None
        raise
    links = "".join(
        [
            f", {tally.dropped_links} supersedes link(s) to memories not here dropped"
            if tally.dropped_links
            else "",
            f", {tally.unseen_links} supersedes link(s) to memories this key cannot read"
            " left as the server holds them"
            if tally.unseen_links
            else "",
            f", {tally.cycle_links} supersedes link(s) that would close a cycle dropped"
            if tally.cycle_links
            else "",
        ]
    )
    click.echo(
        f"restored {tally.restored} {'memory' if tally.restored == 1 else 'memories'}:"
        f" {tally.written} new or changed,"
        f" {tally.unchanged} unchanged, {tally.expired} expired skipped{links}"
    )
