"""Which files `relay import` reads, and the `source` each memory records.

Directories are walked for supported files (Markdown, `.cursorrules`, `.mdc`), skipping
`.git`, `node_modules`, virtualenvs and hidden folders other than `.github` and
`.cursor/rules`, and, in a git work tree, what git ignores (`GitIgnored`); structured data
(JSON, CSV, a `relay export` file) is refused before anything is written. `source` names
a file the same from any working directory: a file in a git work tree is
`<repository>/<path in the repository>`, the repository named by its `origin` remote; any
other file where it sits on this machine (`~/notes/CLAUDE.md`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from relay.errors import InvalidRequestError

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
RULE_FILE_NAMES = frozenset({".cursorrules"})
RULE_SUFFIXES = frozenset({".mdc"})
SKIPPED_DIRS = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__"})
# Hidden directories are skipped except these, where instruction files live.
ALLOWED_HIDDEN = frozenset({".github", ".cursor"})
# Data formats that reading as Markdown would mangle, by suffix; JSON is also found by content.
STRUCTURED_SUFFIXES = {
    ".json": "JSON",
    ".jsonl": "JSON lines",
    ".ndjson": "JSON lines",
    ".csv": "CSV",
    ".tsv": "TSV",
    ".yaml": "YAML",
    ".yml": "YAML",
    ".toml": "TOML",
    ".xml": "XML",
}
EXPORT = "a relay export"  # what `relay restore` reads back
SUPPORTED_FORMATS = (
    "Markdown (.md, .markdown: CLAUDE.md, AGENTS.md), .cursorrules, .mdc"
    " and plain-text rule files (.txt, .windsurfrules)"
)


def is_supported(path: Path) -> bool:
    """Whether `path` names a file type `relay import` understands."""
    name = path.name
    if name in RULE_FILE_NAMES:
        return True
    return not name.startswith(".") and path.suffix.lower() in MARKDOWN_SUFFIXES | RULE_SUFFIXES


def iter_import_files(
    paths: Iterable[Path], ignored: GitIgnored | None = None, unread: list[Path] | None = None
) -> Iterator[Path]:
    """Yield the files to import: files as given, directories expanded recursively.

    Directories yield supported files only, in sorted order, skipping `.git`,
    `node_modules`, virtualenvs and hidden directories other than `.github` and
    `.cursor/rules`, and in a git work tree what git ignores (`ignored` records it).
    Symlinked directories are not followed. What has a supported name but is no file to
    read (a symlink that leads nowhere or to a folder, a FIFO, a socket, a device) is left
    out and added to `unread`, for the caller to say. A file named explicitly is yielded
    whatever
    its name (it is read as Markdown) and whether git ignores it or not (`ignored.named`),
    unless it holds structured data: then, as for any file that turns out to hold JSON,
    `refuse_structured` raises before the caller has written anything. Each file is
    yielded once.
    """
    paths = [Path(path) for path in paths]
    if ignored is None:
        ignored = GitIgnored()
    else:  # only said: one more git call, for a caller that says it
        ignored.named += _ignored_files([path for path in paths if path.is_file()])
    seen: set[Path] = set()
    for path in paths:
        if path.is_dir():
            candidates: Iterable[Path] = _walk(path, ignored, unread)
        elif path.is_file():
            candidates = [path]
        elif path.exists():  # /dev/null, a pipe such as <(cat notes.md), a socket
            raise InvalidRequestError(
                f"{path} is not a file or a folder: relay import reads {SUPPORTED_FORMATS};"
                " nothing was imported",
                path=str(path),
            )
        else:
            raise InvalidRequestError(f"no such file or directory: {path}", path=str(path))
        for file in candidates:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                refuse_structured(file)
                yield file


def refuse_structured(path: Path) -> None:
    """Raise when `path` holds structured data (JSON, JSON lines, CSV, ...), by its suffix or,
    for JSON, its content: read as Markdown it would become junk memories for everyone."""
    kind = _json_kind(path)
    if kind == EXPORT:
        raise InvalidRequestError(
            f"{path} is a relay export file: restore it with `relay restore {path}`; relay"
            f" import reads {SUPPORTED_FORMATS} and would mangle it; nothing was imported",
            path=str(path),
        )
    kind = STRUCTURED_SUFFIXES.get(path.suffix.lower()) or kind
    if kind:
        raise InvalidRequestError(
            f"{path} holds {kind}, which relay import would mangle: it reads"
            f" {SUPPORTED_FORMATS}; nothing was imported",
            path=str(path),
        )


def _json_kind(path: Path) -> str | None:
    """What the file holds when it is a JSON document ("JSON"), one JSON object or array a
    line ("JSON lines"), or the lines of a `relay export` (`EXPORT`), else None. Markdown that
    opens with `[link](...)` is none of these."""
    from relay.restore import is_export_line, json_lines

    try:
        text = path.read_text(encoding="utf-8-sig").strip()
    except (OSError, UnicodeDecodeError):
        return None  # drafts_from_path names the problem
    if not text.startswith(("{", "[")):
        return None
    try:
        values = [json.loads(line) for _, line in json_lines(text)]
    except ValueError:
        values = []
    if values and all(isinstance(value, dict | list) for value in values):
        if all(map(is_export_line, values)):
            return EXPORT
        return "JSON lines" if len(values) > 1 else "JSON"
    try:
        json.loads(text)
    except ValueError:
        return None
    return "JSON"


@dataclass
class GitIgnored:
    """What git's ignore rules (`.gitignore`, `.git/info/exclude`, `core.excludesFile`)
    did to a folder's walk: in a git work tree (or a repository met in the folder, a
    submodule or a nested clone, by its own rules) a walk leaves out what git ignores, as
    `git status` does; a tracked file is never ignored. What the user names is taken as
    named: a file, or a folder git ignores as a whole (walked as outside git)."""

    # Every path git ignores in the work trees walked (absolute, lexical): a folder
    # stands for what it holds.
    paths: set[str] = field(default_factory=set)
    # What a walk left out only because git ignores it: folders it would have entered and
    # files it would have read, each once.
    skipped: dict[str, Path] = field(default_factory=dict)
    # Paths named on the command line that git ignores: imported as named.
    named: list[Path] = field(default_factory=list)
    # Work trees whose ignore rules git could not give (not installed, too slow), and why:
    # walked whole, as outside git.
    unsure: dict[Path, str] = field(default_factory=dict)

    def covers(self, path: Path) -> bool:
        """Whether git ignores `path`, by its own name or a folder's on the way."""
        name = os.path.abspath(path)
        while name not in self.paths:
            if (parent := os.path.dirname(name)) == name:
                return False
            name = parent
        return True

    def ask_git(self, folder: Path) -> None:
        """Learn what git ignores under `folder`; a folder ignored as a whole is named."""
        others = ("ls-files", "--others", "--ignored", "--exclude-standard")
        try:
            # --directory: an ignored folder as one line, never walked by git either.
            listed = set(_git(folder, *others, "--directory"))
            # So is a folder whose every file git ignores (`./` for `folder` itself) while
            # no rule matches it: a folder is ignored as a whole only when one does (or one
            # of a folder on the way), as `git check-ignore` says; else its files (listed
            # one by one) stand for themselves, and a file added there later is read.
            if held := {entry for entry in listed if entry.endswith("/")}:
                whole = set(_git(folder, "check-ignore", "--no-index", stdin=held))
                if partly := held - whole:
                    listed = listed - partly | set(_git(folder, *others, "--", *partly))
        except NoGitAnswer as exc:
            self.unsure[folder] = str(exc)
            return
        if "./" in listed:
            self.named.append(folder)
            return
        base = os.path.abspath(folder)
        self.paths.update(os.path.join(base, entry.rstrip("/")) for entry in listed)


def _walk(
    top: Path, ignored: GitIgnored | None = None, unread: list[Path] | None = None
) -> Iterator[Path]:
    ignored = GitIgnored() if ignored is None else ignored
    found: list[Path] = []
    skipped: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        # A work tree's top (`.git` a folder, or a file in a submodule or linked worktree)
        # has its own rules; the folder named is asked too when inside one.
        if os.path.lexists(here / ".git") or (here == top and git_work_tree(here / "_")):
            ignored.ask_git(here)
        base = os.path.abspath(here)
        # A symlink to a folder is listed as a folder (and not followed), so one with a
        # file's name (`dir.md -> /tmp`) would go unsaid.
        linked = [d for d in dirnames if (here / d).is_symlink() and is_supported(here / d)]
        entered = [d for d in dirnames if _enter_dir(here, d)]
        dirnames[:] = _unless_ignored(here, base, entered, ignored)
        if here.name != ".cursor":  # .cursor holds settings too; only its rules are memories
            # Regular files only: reading a FIFO named notes.md would wait for ever. What is
            # no file but bears a file's name (a symlink that leads nowhere, or to a folder,
            # a FIFO) was meant to be read: said.
            files = [f for f in filenames if is_supported(here / f)]
            for f in _unless_ignored(here, base, sorted(files + linked), ignored):
                (found if (here / f).is_file() else skipped).append(here / f)
    if unread is not None:
        unread.extend(sorted(skipped, key=lambda p: p.relative_to(top).as_posix()))
    yield from sorted(found, key=lambda p: p.relative_to(top).as_posix())


def _unless_ignored(here: Path, base: str, names: list[str], ignored: GitIgnored) -> list[str]:
    """`names` (in `here`, whose absolute path is `base`) but those git ignores, recorded."""
    kept = []
    for name in names:
        full = os.path.join(base, name)
        if full in ignored.paths:
            ignored.skipped.setdefault(full, here / name)
        else:
            kept.append(name)
    return kept


def _ignored_files(files: list[Path]) -> list[Path]:
    """Those of `files` that git ignores, one git call per work tree; none when git cannot
    say (they are imported as named either way: this is only said)."""
    by_tree: dict[Path, dict[str, Path]] = {}
    for file in files:
        if (work_tree := git_work_tree(file)) is not None:
            rel = os.path.relpath(os.path.abspath(file), work_tree)
            by_tree.setdefault(work_tree, {})[Path(rel).as_posix()] = file
    named = []
    for work_tree, rels in by_tree.items():
        try:
            args = ("--others", "--ignored", "--exclude-standard", "--", *rels)
            listed = _git(work_tree, "ls-files", *args)
        except NoGitAnswer:
            continue
        # A repository cloned inside an ignored folder is listed as that folder.
        folders = tuple(entry for entry in listed if entry.endswith("/"))
        named += [file for rel, file in rels.items() if rel in listed or rel.startswith(folders)]
    return named


def _enter_dir(parent: Path, name: str) -> bool:
    if name in SKIPPED_DIRS or (parent / name).is_symlink():
        return False
    if parent.name == ".cursor":
        return name == "rules"
    return not name.startswith(".") or name in ALLOWED_HIDDEN


def source_for(
    path: Path, root: Path | None = None, prefix: str | None = None, follow_links: bool = True
) -> str:
    """The provenance recorded for `path`, POSIX style, the same from any working directory.

    A file in a git work tree is `<repository>/<path in the repository>`, the repository
    named by `repository_name`, so two repositories' `AGENTS.md` stay apart. Any other file
    is named by where it sits on this machine (`place_on_this_machine`): `~/<path>` under
    the home folder, else its absolute path, so two folders' `CLAUDE.md` stay apart too.
    `root` makes the path relative to that folder instead, with no name before it;
    `prefix`, when given, replaces the repository's name, or the `~` or `/` before the
    path (an empty prefix drops it). A symlink to a file in the same work tree (or under
    `root`) is named by that file (`_through_link`); `follow_links=False` names it by its
    own path, as imports did before (`link_names`).
    """
    through = _through_link if follow_links else lambda path, _: path
    if root is not None:
        rel, name = _relative_to(through(path, root), root), (prefix or "").strip("/")
    elif (repo := git_work_tree(path)) is not None:
        target = through(path, repo)
        rel = _relative_to(target if git_work_tree(target) == repo else path, repo)
        name = repository_name(repo) if prefix is None else prefix.strip("/")
    else:
        place = place_on_this_machine(path)
        if prefix is None:
            return place
        rel, name = place.removeprefix("~").lstrip("/"), prefix.strip("/")
    return f"{name}/{rel}" if name else rel


def _through_link(path: Path, top: Path) -> Path:
    """`path`, or the file it leads to when a symlink (the file's, or a folder's on the way)
    takes it elsewhere inside `top`: `CLAUDE.md -> AGENTS.md` imported by either name is
    one file, so one source and one set of memories, not a copy under each name. A link
    out of `top` keeps its own name: where it leads is this machine's business (a
    teammate's link may lead elsewhere), while the link, in the repository, is everyone's."""
    real, real_top = Path(os.path.realpath(path)), Path(os.path.realpath(top))
    if not real.is_relative_to(real_top):
        return path
    return Path(os.path.abspath(top)) / real.relative_to(real_top)


def link_names(
    paths: Iterable[Path], root: Path | None = None, prefix: str | None = None
) -> dict[str, str]:
    """The files among `paths` (folders walked, links and all) that `source_for` names by
    another file they lead to, by their own path's source -> that file's source. An import
    before links were named by their target (or of `CLAUDE.md` when it was a copy) left
    memories under the link's own name, which an import now retires: the link's path
    exists, so nothing else would, and once the target changed the stale copy would keep
    coming back in recall beside it. A link this machine alone made (the repository records
    a regular file at that path: a local type change) is left out: the team's imports of
    that file would write its memories again, and this machine's retire them, in turn."""
    names = {}
    for path in map(Path, paths):
        for file in _walk(path) if path.is_dir() else [path] if path.is_file() else []:
            if os.path.realpath(file) == os.path.abspath(file):  # no link on the way: itself
                continue
            own, named = source_for(file, root, prefix, False), source_for(file, root, prefix)
            if own != named and not _committed_as_a_file(file):
                names[own] = named
    return names


def _committed_as_a_file(file: Path) -> bool:
    """Whether git's index holds `file` as a regular file while it is a link here. Untracked,
    or without git's answer: False (the link is all there is to go by)."""
    work_tree = git_work_tree(file)
    if work_tree is None:
        return False
    rel = Path(os.path.abspath(file)).relative_to(work_tree).as_posix()
    try:
        entries = _git(work_tree, "ls-files", "-s", "--", rel)
    except NoGitAnswer:
        return False
    return any(not entry.startswith("120000 ") for entry in entries)


def place_on_this_machine(path: Path) -> str:
    """Where `path` sits, the same from any working directory: `~/notes/CLAUDE.md` under the
    home folder (whose owner's name it need not record), else `/srv/docs/CLAUDE.md`.

    The folder is resolved, so a symlinked folder (or working directory) names the same
    place; the file itself is recorded where it sits, a symlink by its own name."""
    full = Path(os.path.abspath(path))
    folder = Path(os.path.realpath(full.parent))
    home = Path(os.path.realpath(os.path.expanduser("~")))
    if home != Path(home.anchor) and folder.is_relative_to(home):
        return (Path("~") / folder.relative_to(home) / full.name).as_posix()
    return (folder / full.name).as_posix()


def folder_prefixes(paths: Iterable[Path], prefix: str | None = None) -> dict[str, Path]:
    """Each named folder, by the source prefix of the files under it (`acme/api/docs/`,
    `~/notes/`), and each path named that a git work tree no longer has (`gone_path`), by
    that prefix and by its own source (`acme/api/docs`, no `/`: a file deleted stands for
    itself alone). Only in a git work tree does a source name one file on every machine,
    and git tell a deleted file from a moved one, so only there may a file missing from the
    folder retire what was imported from it; elsewhere its memories are only counted."""
    found = {}
    for path in map(Path, paths):
        if path.is_dir() or gone_path(path):
            found[source_for(path / "_", None, prefix)[:-1]] = path
        if not path.is_dir() and gone_path(path):
            found[source_for(path, None, prefix)] = path
    return found


def gone_path(path: Path) -> bool:
    """Whether `path`, not there, may be a file or folder of a git work tree deleted since
    an import: `relay import SINGLE.md` retires the file's memories as a folder's import
    would, and `relay import docs` those imported from under a folder whose files were all
    deleted (git keeps no empty folder, so a clone has none), as for a folder emptied."""
    return not os.path.lexists(path) and git_work_tree(path) is not None


@dataclass(frozen=True)
class FormerName:
    """Where an import before the whole remote path named repositories put a file's
    memories (`former_repository_name`): its source then, and its repository's prefix."""

    source: str  # infra/terraform/AGENTS.md
    prefix: str  # infra/terraform/
    work_tree: Path


def former_name(path: Path, root: Path | None, prefix: str | None) -> FormerName | None:
    """Where an import before today's naming of repositories put `path`'s memories, when
    that differs from `source_for(path, root, prefix)`; else None."""
    work_tree = git_work_tree(path) if root is None and prefix is None else None
    was = former_repository_name(work_tree) if work_tree is not None else None
    if work_tree is None or was is None:
        return None
    return FormerName(source_for(path, None, was), f"{was}/", work_tree)


class NoGitAnswer(Exception):
    """git could not say which files a checkout deleted (not installed, not a repository,
    too slow); the message says why."""


def git_deleted(work_tree: Path, paths: Collection[str]) -> set[str]:
    """Which of `paths` (POSIX, relative to `work_tree`, none of them on disk) the checkout
    deleted: held by a commit in the history of HEAD and gone since, by a commit deleting or
    renaming it or from the work tree. Not a file this branch never held (another branch's,
    or added after this clone was last pulled), nor one a sparse checkout leaves out: the
    checkout lacks those, no one deleted them. Two git calls, whatever the number of paths;
    raises NoGitAnswer when git cannot say."""
    if not paths:
        return set()
    spec = ["--", *sorted(paths)]
    # A branch with no commit yet has no history: it deleted nothing (--ignore-missing).
    log = ["log", "--ignore-missing", "HEAD", "--no-renames", "--format=", "--name-only"]
    history = _git(work_tree, *log, *spec)
    # `S`: skip-worktree, a file HEAD holds that a sparse checkout leaves out.
    sparse = {p[2:] for p in _git(work_tree, "ls-files", "-t", *spec) if p.startswith("S ")}
    return (set(history) & set(paths)) - sparse


def _git(work_tree: Path, *args: str, stdin: Collection[str] | None = None) -> list[str]:
    """The NUL-separated names `git ARGS -z` prints, or NoGitAnswer saying why none. Paths
    are literal: a file named `*.md` is that file, not a pattern. `stdin`: the paths
    `git check-ignore --stdin` reads (which takes no pathspec, so no pattern either), of
    which it prints those ignored (exit 1 for none)."""
    literal = ["--literal-pathspecs"] if stdin is None else []
    command = ["git", "-C", str(work_tree), *literal, *args[:1], "-z", *args[1:]]
    fed = None if stdin is None else "".join(f"{path}\0" for path in stdin).encode()
    if stdin is not None:
        command.append("--stdin")
    try:
        done = subprocess.run(
            command, input=fed, capture_output=True, timeout=GIT_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise NoGitAnswer("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise NoGitAnswer(f"git {args[0]} took over {GIT_TIMEOUT} seconds") from None
    except OSError as exc:
        raise NoGitAnswer(f"git did not run: {exc.strerror or exc}") from None
    if done.returncode != 0 and not (stdin is not None and done.returncode == 1):
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise NoGitAnswer(said[-1] if said else f"git {args[0]} failed ({done.returncode})")
    return [name for name in done.stdout.decode("utf-8", "surrogateescape").split("\0") if name]


# How long git may take to say which files a checkout deleted (a long history on a slow
# disk) before the import leaves their memories as they are instead.
GIT_TIMEOUT = 120


def git_work_tree(path: Path) -> Path | None:
    """The top of the git work tree holding `path`, found lexically, or None."""
    # `.git` is a file in linked worktrees and submodules, so any kind of entry counts.
    for folder in Path(os.path.abspath(path)).parents:
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def repository_name(work_tree: Path) -> str:
    """What names a repository the same on every teammate's machine: the whole path of its
    `origin` remote (`git@github.com:acme/api.git` -> `acme/api`,
    `git@gitlab.example.com:platform/infra/terraform.git` -> `platform/infra/terraform`),
    else the folder's name. Two repositories in folders of the same name (`api`), or in
    GitLab groups that end alike (`platform/infra`, `data/infra`), would otherwise share
    sources, and re-importing one would overwrite and retire the other's memories.

    The host is left out: teammates reach one repository under different hosts (an ssh
    alias such as `github-work:acme/api`, a mirror, https or ssh), and each must name it
    alike; and GitHub's sources stay `owner/repo/...`, as they always were. A remote that
    is a folder (`/srv/git/api.git`, `file://...`, `../api.git`) keeps its last two parts
    (`git/api`), as every remote did before: its whole path is where it sits on one
    machine (`/home/alice/...`, a teammate's name in a shared source)."""
    url = _origin_url(work_tree)
    parts, local = _remote_parts(url) if url else ([], True)
    if parts:
        return "/".join(parts[-2:] if local else parts)
    return work_tree.name


def former_repository_name(work_tree: Path) -> str | None:
    """The name an import before the whole remote path named repositories gave this one
    (the remote's last two parts: `infra/terraform`), when it differs from today's; else
    None. An import names the memories stored under it that copy its files'
    (`import_writer.former_copies`), and leaves them unless asked: another repository
    may bear that name today."""
    url = _origin_url(work_tree)
    parts, local = _remote_parts(url) if url else ([], True)
    return "/".join(parts[-2:]) if len(parts) > 2 and not local else None


def _remote_parts(url: str) -> tuple[list[str], bool]:
    """The parts of a remote's path, without its host, and whether it is a folder on this
    machine (git's own rule: no `scheme://` nor `host:` before the path, or `file://`)."""
    url = url.strip()
    scheme = re.match(r"([a-z+]+)://", url)
    local = scheme.group(1) == "file" if scheme else not re.match(r"[^/:]+:", url)
    path = re.sub(r"^[a-z+]+://[^/]*/|^[^/:]+:", "", url).removesuffix(".git")
    # `.` and `..` (a remote given as a relative folder) would step out of the name.
    return [part for part in path.rstrip("/").split("/") if part not in ("", ".", "..")], local


def named_by_folder(path: Path, root: Path | None, prefix: str | None) -> Path | None:
    """The work tree whose folder name alone names `path`'s source (no origin remote, no
    `--source-prefix`, no `--root`), or None. Another repository in a folder of the same
    name would share those sources, and re-importing either would overwrite and retire
    the other's memories: worth a warning."""
    if root is not None or prefix is not None:
        return None
    work_tree = git_work_tree(path)
    return work_tree if work_tree is not None and not _origin_url(work_tree) else None


def named_by_place(path: Path, root: Path | None) -> bool:
    """Whether `path`'s source is where it sits on this machine (outside any git work tree,
    no `--root`): a teammate's copy elsewhere gets memories of its own, and a different file
    at that place on their machine would overwrite and retire these. Worth a warning."""
    return root is None and git_work_tree(path) is None


def _origin_url(work_tree: Path) -> str | None:
    """The `origin` remote's URL from the repository's config (a linked worktree's or a
    submodule's `.git` is a file naming its git folder; a worktree's config is shared)."""
    git = work_tree / ".git"
    try:
        if git.is_file():
            line = git.read_text(encoding="utf-8").strip()
            git = (work_tree / line.removeprefix("gitdir:").strip()).resolve()
            common = git / "commondir"
            if common.is_file():
                git = (git / common.read_text(encoding="utf-8").strip()).resolve()
        config = (git / "config").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    section = re.search(r'^\[remote "origin"\]\s*$(.*?)(?=^\[|\Z)', config, re.M | re.S)
    url = section and re.search(r"^\s*url\s*=\s*(\S+)", section.group(1), re.M)
    return url.group(1) if url else None


def _relative_to(path: Path, root: Path) -> str:
    # Lexical, not resolved: `_through_link` already chose the name a symlink goes by.
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        raise InvalidRequestError(
            f"{path} is not inside the import root {root}", path=str(path)
        ) from None
