"""`relay import`: instruction files in as memories, over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from relay.cli.common import (
    client_options,
    failed_midway,
    maybe_written,
    one_line,
    progress_bar,
    stop_interrupted,
    terminate_as_interrupt,
)
from relay.errors import InvalidRequestError, RelayError

if TYPE_CHECKING:
    from relay.import_files import FormerName, GitIgnored
    from relay.importer import ImportDraft


def _there_or_gone(
    ctx: click.Context, param: click.Parameter, paths: tuple[Path, ...]
) -> tuple[Path, ...]:
    """PATHS as click's `exists=True` would have them, but for a path a git work tree no
    longer has (`gone_path`): checked while the arguments are read, before the command asks
    for a server, so a typo outside git is told as such, not as a missing server URL."""
    from relay.import_files import gone_path

    for path in paths:
        if not path.exists() and not gone_path(path):
            raise click.UsageError(_not_there(path), ctx)
    return paths


def _not_there(path: Path) -> str:
    """Why `path`, named, cannot be read: a symlink whose target is gone says so."""
    import os

    if os.path.islink(path):
        return f"{path} is a symlink to {os.readlink(path)}, which is not there"
    return f"no such file or folder: {path}"


@click.command("import")
@click.argument(
    "paths", nargs=-1, required=True, type=click.Path(path_type=Path), callback=_there_or_gone
)
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Make sources relative to this folder instead (no repository name).",
)
@click.option(
    "--source-prefix",
    metavar="NAME",
    help="Name that starts every source, in place of the repository's (or of ~ or /"
    " outside a git work tree; '' for none).",
)
@click.option(
    "--audience",
    "audiences",
    multiple=True,
    help="Audience for every memory written (repeatable; default: a memory imported before"
    " keeps its own, a new one is for all). Refused unless the key reads one of them (its"
    " roles, or all; an admin key reads every one): it could not keep them in step.",
)
@click.option(
    "--keep-removed",
    is_flag=True,
    help="Keep the memories of sections no longer in a file (default: forget them).",
)
@click.option(
    "--retire-ignored",
    is_flag=True,
    help="Also retire the memories an import made of files git ignores, still on disk, in"
    " the folders named (default: leave them, counted).",
)
@click.option(
    "--retire-former-name",
    is_flag=True,
    help="Also retire the copies of this import's sections that an older release made under"
    " a repository's former two-part name (default: leave them, named).",
)
@client_options
def import_(
    client,  # noqa: ANN001
    paths: tuple[Path, ...],
    root: Path | None,
    source_prefix: str | None,
    audiences: tuple[str, ...],
    keep_removed: bool,
    retire_ignored: bool,
    retire_former_name: bool,
) -> None:
    """Import Markdown, CLAUDE.md, AGENTS.md, .cursorrules and .mdc files: one memory per
    section or rule (a section over 16,000 characters: several, titled "(part N)").

    Any other text file named explicitly (CONVENTIONS.txt, .windsurfrules) is read as
    Markdown. Structured data (JSON, JSON lines, CSV, TSV, YAML, TOML, XML) is refused
    and nothing is imported. A control character no memory may hold (NUL, the ESC of a
    terminal colour, 0x1C-0x1F) is replaced by U+FFFD wherever it stands (a line's end, a
    heading), and a warning names the file and section; a
    file that is not UTF-8 text is skipped, named, and the import exits 2 at the end.

    In a git work tree a folder's import reads only what git does not ignore: tracked
    files, and untracked ones no .gitignore, .git/info/exclude or core.excludesFile
    rule matches (a submodule or a repository cloned inside by its own rules), as git
    status shows them; the summary counts what it skipped so (not node_modules,
    virtualenvs or hidden folders, never read, in git or not). What you name is imported
    as named: a file git ignores, or a folder it ignores as a whole (a note says so).
    An ignore rule deletes nothing: the memories an import made of a file git ignores
    now (read before, or named), still there, are left as they are and counted;
    --retire-ignored retires them (not with --root). Outside git, and where git cannot
    say (not installed: warned), every file is read. What a folder holds under an
    importable name that is no file to read (a symlink that leads nowhere, or to a folder,
    which a folder's import does not follow; a FIFO) is skipped with a warning naming it.

    \b
    Each memory's source names its file the same way from any folder:
      - in a git work tree: <repository>/<path in the repository>, the repository
        named by its origin remote's path (acme/shop-backend/AGENTS.md; a remote
        that is a folder by its last two parts), else by its folder; copies of
        its sections an older release made under the remote's last two parts
        (where that name holds no other repository's file) are named and left
        alone: --retire-former-name retires them;
      - elsewhere: where it sits on this machine, ~/notes/CLAUDE.md under your
        home folder, else its absolute path (warned about: a teammate's copy
        sits elsewhere; --root FOLDER --source-prefix NAME names it for all);
      - with --root: the path relative to that folder.
    A symlink to a file in the same work tree (or --root), such as CLAUDE.md ->
    AGENTS.md, is named by that file: either name makes the same memories, and
    those an import made under the link's own name are retired.
    Ids derive from the source and the section, so re-importing is idempotent; a
    section keeps its memory wherever it moves in the file, and an edit to it is a
    new revision (a rule rewritten into another is a new memory).
    Re-importing a file forgets the memories of sections it no longer has, and importing
    a folder of a git work tree forgets those of its files deleted or renamed since, as
    git tells (in the current branch's history, or from the work tree; not with
    --keep-removed), even when it has no file left to read ("imported 0 memories"; "nothing
    to import", exit 0, only when nothing imported from it is gone either), or is
    gone whole (git keeps no empty folder): a path a work tree no longer has may be
    named when memories were imported from it (a file deleted: its own are retired) or
    from under it, and again once they are retired ("gone", exit 0; a path that never
    held any is exit 2). A file this checkout merely lacks
    (another branch's, newer than this clone, outside a sparse checkout) keeps its
    memories, as does every missing file when git cannot tell; the summary counts them.
    Outside a git work tree no file missing from a folder is retired (nothing tells a
    deleted file from a moved one): the summary counts its memories and a note names it
    with their ids, for relay forget ID. With --root, missing files are not looked for.
    Memories from other files or written by hand are never touched. The file is the
    source of truth: a relay edit of an imported memory is undone and a section deleted
    by hand comes back; the summary counts both. A memory changed while the import runs
    (after it read it) is neither written over nor retired: a note names it, and
    importing again writes or retires it as the file says."""
    from relay.import_files import (
        GitIgnored,
        folder_prefixes,
        former_name,
        gone_path,
        iter_import_files,
        link_names,
        named_by_folder,
        named_by_place,
        source_for,
    )
    from relay.import_writer import (
        ImportTally,
        Vanished,
        check_drafts,
        check_readable,
        deleted_count,
        former_copies,
        import_files,
        owned_memories,
        vanished,
    )
    from relay.importer import drafts_from_path

    for flag, asked in (("ignored", retire_ignored), ("former-name", retire_former_name)):
        if asked and keep_removed:
            raise click.UsageError(f"--retire-{flag} retires what --keep-removed keeps: pass one")
    if retire_ignored and root:
        raise click.UsageError(
            "--retire-ignored does nothing with --root, which looks for no file gone or ignored"
        )
    if source_prefix is not None and not source_prefix.isprintable():
        raise InvalidRequestError(
            f"--source-prefix {source_prefix!r} holds a line break or another control"
            " character: a source is one line, like docs/deploy.md"
        )
    looks = not (keep_removed or root)  # for the memories of files gone from the folders
    for path in paths:  # a file or folder a git work tree lost is looked for too
        if not path.exists() and not (looks and gone_path(path)):
            raise click.UsageError(_not_there(path))
    check_readable(client, audiences)
    drafts_by_source: dict[str, list] = {}
    failed: list[RelayError] = []
    unnamed: dict[Path, None] = {}  # work trees named by their folder alone, in order
    placed: list[str] = []  # sources of files named by where they sit on this machine
    files_by_source: dict[str, Path] = {}
    former: dict[str, FormerName] = {}  # source -> where an import before today put the file
    ignored = GitIgnored()
    unread: list[Path] = []  # in the folders, with a file's name but no file to read
    for f in iter_import_files([path for path in paths if path.exists()], ignored, unread):
        work_tree = named_by_folder(f, root, source_prefix)
        if work_tree is not None:
            unnamed[work_tree] = None
        try:
            drafts = drafts_from_path(f, root, source_prefix)
        except RelayError as exc:  # one unreadable file must not sink the rest
            failed.append(exc)
            click.echo(one_line(f"relay: skipped {f}: {exc.message}"), err=True)
            continue
        _say_replaced(drafts)
        source = source_for(f, root, source_prefix)
        if source in files_by_source:  # one would overwrite and retire the other's memories
            raise InvalidRequestError(
                f"{files_by_source[source]} and {f} would both be recorded as {source}, and"
                " importing one would overwrite and retire the other's memories; nothing was"
                " imported: import them apart, each with its own --source-prefix",
                path=str(f),
            )
        files_by_source[source] = f
        if named_by_place(f, root):
            placed.append(source)
        drafts_by_source[source] = drafts
        if then := former_name(f, root, source_prefix):
            former[source] = then
        if not drafts:
            click.echo(f"relay: note: {f} holds no section with text: nothing to import", err=True)
    drafts = [d for file_drafts in drafts_by_source.values() for d in file_drafts]
    check_drafts(drafts, audiences, lambda source: owned_memories(client, source))
    for work_tree in unnamed:  # said once everything is checked, just before writing
        click.echo(
            f"relay: warning: {work_tree} has no origin remote, so its sources are named by"
            f" its folder ({work_tree.name}/...): another repository in a folder of that name"
            " would share them, and importing it would overwrite and retire these; name it"
            " with --source-prefix",
            err=True,
        )
    _say_what_git_ignored(ignored)
    _say_unread(unread)
    if placed:
        first, more = placed[0], len(placed) - 1
        click.echo(
            "relay: warning: outside any git work tree, a source names where the file sits"
            f" on this machine ({first}{f' and {more} more' if more else ''}): a teammate's"
            " copy elsewhere becomes memories of its own, and a different file at that place"
            " on their machine would overwrite and retire these; to name a folder the same on"
            " every machine, import it with --root FOLDER --source-prefix NAME",
            err=True,
        )
    folders = folder_prefixes(paths, source_prefix) if looks else {}
    found = vanished(client, folders, drafts_by_source, ignored) if looks else Vanished()
    retired_before: list[Path] = []  # gone, its memories retired by an earlier import
    for path in dict.fromkeys(folders.values()):  # a path gone: as a file, or a folder
        prefixes = [p for p, f in folders.items() if f == path]
        if path.exists() or any(found.under(p) for p in prefixes):
            continue
        # A CI job imports docs/ on every commit: once a run retired it, the next must not
        # fail. Only a path no memory was ever imported from (a typo) is an error.
        if not (n := deleted_count(client, prefixes)):
            raise click.UsageError(
                f"no such file or folder: {path}, nor memories imported from it or from"
                " under it: nothing to import or retire"
            )
        retired_before.append(path)
        its = "its memory was" if n == 1 else f"its {n} memories were"
        click.echo(f"nothing to import in {path}: gone, and {its} retired before (or forgotten)")
    if retire_ignored:  # asked for: what is still on disk is retired only so
        found.gone.update(found.ignored)
        found.ignored = {}
    if not drafts_by_source and not failed and found.empty():
        # Only now: a folder with no file left to read still retires (or names) the
        # memories of those gone from it, as `relay import .` would. An empty folder is no
        # mistake of the user's (a CI job importing docs/ before it has any): said, exit 0.
        if rest := tuple(path for path in paths if path not in retired_before):
            click.echo(_nothing_found(rest, ignored, looked=looks))
        return
    # A link named by its target now: the memories an import made under its own name are
    # a stale copy of the target's (not another file's: a source this import writes stays).
    relinked = {
        own: (named, stale)
        for own, named in ({} if keep_removed else link_names(paths, root, source_prefix)).items()
        if named in drafts_by_source and own not in drafts_by_source
        if (stale := {m["id"]: m for m in owned_memories(client, own)})
    }
    found.gone.update({own: stale for own, (_, stale) in relinked.items()})
    copies = former_copies(client, former, drafts_by_source)
    if retire_former_name:
        found.gone.update(copies)
    tally = ImportTally()

    def done(exc: BaseException | None = None) -> str:
        return (
            f"{tally.written + tally.unchanged} of {len(drafts)} memories imported"
            f" ({tally.written} new or changed, {tally.unchanged} unchanged) and"
            f" {tally.retired} retired{maybe_written(tally.in_flight, exc)}"
        )

    try:
        with terminate_as_interrupt(), progress_bar(len(drafts), "importing") as bar:
            import_files(
                client,
                drafts_by_source,
                audiences,
                keep_removed,
                bar.update,
                found.gone,
                tally,
            )
    except KeyboardInterrupt:
        stop_interrupted(done(), "import")
    except RelayError as exc:
        if maybe_written(tally.in_flight, exc) or tally.written or tally.unchanged or tally.retired:
            raise failed_midway(exc, done(exc), "import") from None
        raise

    # Not errors (the file is the source of truth), but neither should come as a surprise.
    for d in tally.overwritten:
        click.echo(
            f"relay: note: {d.source} › {d.title or d.id}: edited since this text was"
            f" imported; the file's text replaced the edit (relay history {d.id} shows it)",
            err=True,
        )
    if not retire_former_name:
        _left_former(copies, former)
    for d, was in tally.revived:
        click.echo(
            f"relay: note: {d.source} › {d.title or d.id}: its id {was} is taken (its memory"
            " was deleted, by relay forget or when it left the file, or is one this key cannot"
            f" read); imported again as {d.id}",
            err=True,
        )
    for own, (named, stale) in sorted(relinked.items()):
        n = len(stale)
        click.echo(
            f"relay: note: {own} leads to {named} and is named by it now: the"
            f" {'memory' if n == 1 else f'{n} memories'} imported under its own name"
            f" {'was' if n == 1 else 'were'} retired ({named}'s hold its text)",
            err=True,
        )
    for d in tally.changed:
        click.echo(
            f"relay: note: {d.source} › {d.title or d.id}: changed (relay edit, or another"
            " import) after this import read it, so left as it is; import again to write the"
            f" file's text over it (relay history {d.id} shows the change)",
            err=True,
        )
    for m in tally.unretired:
        click.echo(
            f"relay: note: {m['source']} › {m['title'] or m['id']}: no longer in the file, but"
            " changed (relay edit, relay forget, or another import) after this import read"
            " it, so not retired; import again to retire it as it is then (relay history"
            f" {m['id']} shows the change)",
            err=True,
        )
    if found.absent:
        first, more = min(found.absent), len(found.absent) - 1
        files = f"{first} and {more} more are" if more else f"{first} is"
        why = (
            f"git could not say whether this branch deleted them ({found.unsure})"
            if found.unsure
            else "this branch's history never deleted them (another branch's files, files"
            " newer than this clone, or left out of a sparse checkout)"
        )
        click.echo(
            one_line(
                f"relay: note: {files} not in this checkout, but {why}: their memories"
                " are left as they are"
            ),
            err=True,
        )
    for source, ids in sorted(found.outside_git.items()):
        n = len(ids)
        click.echo(
            f"relay: note: {source} is not in its folder on this machine, and outside a git"
            " work tree relay cannot tell a deleted file from one moved, not there yet, or"
            " another machine's (a teammate's ~/ is theirs): its"
            f" {'memory is' if n == 1 else f'{n} memories are'} left as"
            f" {'it is' if n == 1 else 'they are'}, still recalled; if the file was deleted,"
            f" relay forget ID removes {'it' if n == 1 else 'each'}: {' '.join(sorted(ids))}",
            err=True,
        )
    also = _left_ignored(found.ignored)
    if n := sum(map(len, found.outside_git.values())):
        also += (
            f"; {n} {'memory comes from a file' if n == 1 else 'memories come from files'}"
            f" missing outside git, left as {'it is' if n == 1 else 'they are'}"
        )
    if n := sum(map(len, found.absent.values())):
        also += (
            f"; {n} {'memory comes from a file' if n == 1 else 'memories come from files'} this"
            f" checkout does not have, left as {'it is' if n == 1 else 'they are'}"
        )
    if n := len(tally.overwritten):
        it = "it was" if n == 1 else "they were"
        also += f"; {n} edited since {it} imported {'was' if n == 1 else 'were'} overwritten"
    if n := len(tally.revived):
        also += (
            f"; {n} deleted before (or hidden from this key)"
            f" {'was' if n == 1 else 'were'} imported again"
        )
    if n := len(tally.changed) + len(tally.unretired):
        also += (
            f"; {n} changed while this import ran"
            f" {'was left as it is' if n == 1 else 'were left as they are'}"
        )
    if skipped := _skipped(ignored):
        also += f"; {skipped}"
    click.echo(
        f"imported {len(drafts)} {'memory' if len(drafts) == 1 else 'memories'}:"
        f" {tally.written} new or changed,"
        f" {tally.unchanged} unchanged, {tally.retired} retired{also}"
    )
    if failed:  # the others are written: said last, as an error, with the first one's exit code
        raise type(failed[0])(f"{len(failed)} file(s) could not be imported (see above)")


def _say_what_git_ignored(ignored: GitIgnored) -> None:
    """Warn of the folders whose ignore rules git could not give (read whole), and note
    the paths named that git ignores (imported as named): a shell's `**/*.md` names
    node_modules' too."""
    for folder, why in ignored.unsure.items():
        click.echo(
            one_line(
                f"relay: warning: git could not say what {folder} ignores ({why}): its files"
                " are read as outside git, those it ignores included"
            ),
            err=True,
        )
    if ignored.named:
        first, more = ignored.named[0], len(ignored.named) - 1
        click.echo(
            one_line(
                f"relay: note: git ignores {first}{f' and {more} more' if more else ''}, named"
                " here: imported as named (importing a folder leaves out what git ignores)"
            ),
            err=True,
        )


def _say_replaced(drafts: list[ImportDraft]) -> None:
    """Warn, by file and section, of the control characters replaced by U+FFFD (a NUL, the
    ESC of a pasted terminal colour): the memory is written, but not as the file has it."""
    from relay.importer import draft_label

    for ordinal, draft in enumerate(drafts, start=1):
        if n := len(draft.replaced):
            shown = ", ".join(repr(ch)[1:-1] for ch in sorted(set(draft.replaced)))
            click.echo(
                one_line(
                    f"relay: warning: {draft_label(draft, ordinal)}: {n} control"
                    f" character{'s' if n > 1 else ''} ({shown}) replaced with U+FFFD (\ufffd):"
                    " a memory holds none (terminal escape codes, binary data); edit the file"
                    " to drop or replace them"
                ),
                err=True,
            )


# How many of what a folder's walk could not read are named one a line; the rest are counted.
SHOWN_UNREAD = 5


def _say_unread(unread: list[Path]) -> None:
    """Warn of what a folder's walk left out though it bears an importable name: a symlink
    that leads nowhere (a target deleted or moved) or to a folder, a FIFO, a socket. Each
    was likely meant to be read, and its memories are not there."""
    for path in unread[:SHOWN_UNREAD]:
        click.echo(one_line(f"relay: warning: skipped {path}: {_not_a_file(path)}"), err=True)
    if (more := len(unread) - SHOWN_UNREAD) > 0:
        click.echo(
            f"relay: warning: skipped {more} more that {'is' if more == 1 else 'are'} not files"
            " to read",
            err=True,
        )


def _not_a_file(path: Path) -> str:
    """What `path`, no regular file, is instead: the words after `skipped PATH: `."""
    import os

    if os.path.islink(path):
        to = f"a symlink to {os.readlink(path)}"
        if not path.exists():
            return f"{to}, which is not there"
        if path.is_dir():
            return f"{to}, a folder: symlinked folders are not followed (name it to import it)"
        return f"{to}, {_kind(path.stat().st_mode)}"
    return _kind(path.lstat().st_mode)


def _kind(mode: int) -> str:
    import stat

    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file: reading it would wait for a writer"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    return "a device, not a file"


def _left_ignored(kept: dict[str, dict[str, dict]]) -> str:
    """The summary's words for the memories of files git ignores that are left as they are
    (by source). Counted, with no note of their own: a file named on purpose
    (`relay import CLAUDE.local.md`) stays so on every import of its folder, as wanted, and
    a note each time would nag; the count keeps the others in sight (--retire-ignored)."""
    if not (n := sum(map(len, kept.values()))):
        return ""
    return (
        f"; {n} {'memory comes from a file' if n == 1 else 'memories come from files'}"
        f" git ignores, left as {'it is' if n == 1 else 'they are'}"
    )


def _skipped(ignored: GitIgnored) -> str:
    """The words for what the walk left out because git ignores it ("" for nothing)."""
    if not ignored.skipped:
        return ""
    folders = sum(path.is_dir() for path in ignored.skipped.values())
    files = len(ignored.skipped) - folders
    counted = [
        f"{n} {word}{'s' if n > 1 else ''}"
        for n, word in ((folders, "folder"), (files, "file"))
        if n
    ]
    return f"skipped {' and '.join(counted)} git ignores"


def _nothing_found(paths: tuple[Path, ...], ignored: GitIgnored, looked: bool) -> str:
    """The summary of an import with nothing to do: no file to read in the folders named
    and, when it `looked` (not with --keep-removed or --root), no memory of a file gone
    from them to retire or name."""
    first, more = paths[0], len(paths) - 1
    skipped = f" ({why})" if (why := _skipped(ignored)) else ""
    gone = ", nor memories of files gone from there to retire" if looked else ""
    return (
        f"nothing to import in {first}{f' and {more} more' if more else ''}: no file relay"
        f" import reads there{skipped}{gone}"
    )


def _left_former(copies: dict[str, dict[str, dict]], former: dict[str, FormerName]) -> None:
    """Note, by repository, the copies of this import's sections that an older release
    made under its former name (`former_copies`), left as they are: recalled beside
    these, until asked to retire them. Said while they are there, no longer."""
    prefixes = {then.source: then.prefix for then in former.values()}
    by_prefix: dict[str, list[str]] = {}
    for was in sorted(copies):
        by_prefix.setdefault(prefixes[was], []).append(was)
    for prefix, sources in by_prefix.items():
        n, more = sum(len(copies[was]) for was in sources), len(sources) - 1
        click.echo(
            one_line(
                f"relay: note: {n} {'memory' if n == 1 else 'memories'} under {prefix}"
                f" ({sources[0]}{f' and {more} more' if more else ''})"
                f" {'copies' if n == 1 else 'copy'} sections imported here: an older release"
                f" made {'it' if n == 1 else 'them'} when this repository's remote was named by"
                f" its last two parts ({prefix.rstrip('/')}); left as"
                f" {'it is' if n == 1 else 'they are'}, recalled beside this import's; import"
                " again with --retire-former-name to retire them"
            ),
            err=True,
        )
