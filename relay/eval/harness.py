"""The machinery the replay and the fault drills share: a real `relay serve` over a bench
folder, and the real `relay-hook` run as a subprocess with its own HOME and outcome log.

Process handling (environment, timing, the quiet-output check, byte-compiling the
hook) comes from `relay.hook_bench`, so the replay measures the hook exactly as
`relay bench hook` does: wall time from spawn to exit.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.errors import InvalidRequestError, RelayError
from relay.hook_bench import HOOK, _free_port, hook_env, timed

Progress = Callable[[str], None]
READ = frozenset({"memory:read"})
ADMIN = frozenset({"admin", "memory:read", "memory:write"})


@dataclass
class OrgKeys:
    """One bench store as an organisation, with the keys a run needs (secrets)."""

    org_id: str
    read: dict[str, str]  # one read key per replay mode: each mode has its own cache entries
    admin: str
    read_ids: dict[str, str] = field(default_factory=dict)


def file_digest(path: Path) -> dict[str, Any]:
    """What a file held: its size and SHA-256 (milliseconds for the largest bench file, next
    to the minutes its memories take to load)."""
    import hashlib

    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def load_recipe(folder: Path, distractors: Path | None, used: set[str] | None) -> dict[str, Any]:
    """What decides a loaded database's content: the memories loaded (by content, not by
    path: an edited memories.jsonl is other data in the same folder), the distractors and
    which stores hold them, the embedding model and Relay's version (its write path)."""
    from relay import __version__
    from relay.embedding import PROVIDERS

    return {
        "memories": file_digest(folder / "memories.jsonl"),
        "distractors": file_digest(distractors / "memories.jsonl") if distractors else None,
        "distractors_in": sorted(used) if distractors and used is not None else None,
        "embedder": PROVIDERS["onnx"].name,
        "relay": __version__,
    }


_CHANGED = {
    "memories": "its memories.jsonl changed",
    "distractors": "the distractors changed",
    "distractors_in": "other stores are replayed, and only those hold the distractors",
    "embedder": "the embedding model changed",
    "relay": "Relay's version changed",
}


def _why_not_kept(marker: Path, recipe: dict[str, Any]) -> str | None:
    """None when the database beside `marker` was loaded from `recipe`; else why it was not."""
    try:
        loaded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no replay loaded one there"
    before = loaded.get("recipe") if isinstance(loaded, dict) else None
    if not isinstance(before, dict):
        return "no replay loaded one there"
    return next((why for k, why in _CHANGED.items() if before.get(k) != recipe[k]), None)


def _saved_keys(marker: Path) -> dict[str, dict[str, str]]:
    """The keys a replay kept beside the database: {store: {mode or "admin": secret}}."""
    try:
        loaded = json.loads(marker.read_text(encoding="utf-8"))
        keys = loaded.get("keys")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(keys, dict):
        return {}
    return {
        name: {role: v for role, v in roles.items() if isinstance(v, str)}
        for name, roles in keys.items()
        if isinstance(roles, dict)
    }


def _valid(store: Any, secret: str, org_id: str) -> bool:
    """The key still authenticates, for this organisation (not revoked, not expired)."""
    from relay.auth import authorize
    from relay.errors import UnauthorizedError

    try:
        return authorize(store, f"Bearer {secret}").org_id == org_id
    except UnauthorizedError:
        return False


def load_database(
    db: Path,
    folder: Path,
    distractors: Path | None,
    modes: tuple[str, ...],
    progress: Progress | None = None,
    used: set[str] | None = None,
    reuse: bool = False,
) -> dict[str, OrgKeys]:
    """Every store of `folder` as an organisation (the production write path), the ones in
    `used` (default all) also holding every memory of `distractors`; returns keys per store.

    With `reuse`, a database this function loaded before from the same data (`load_recipe`:
    the files' content, not their path) is kept, with the keys it minted for it: each run
    starts its own server, so no mode can be served answers cached for another run, and
    minting anew would add a key per mode and store to the database on every run. The
    keys' secrets are kept beside the database (readable by its owner alone), which
    grants no more than the database file itself does. A drill's run (no `reuse`) always
    loads afresh, and the next replay too: drills delete memories and revoke keys.
    """
    from relay.auth import mint_key
    from relay.bench_recall import load_folder, memory_draft, read_jsonl
    from relay.embedding import load_embedder
    from relay.key_shape import split_key
    from relay.store.sqlite import SQLiteStore
    from relay.writes import save_many

    marker = db.with_name(db.name + ".loaded.json")
    recipe = load_recipe(folder, distractors, used)
    why = _why_not_kept(marker, recipe) if reuse else "a drill changes the database"
    kept = why is None
    if not kept:
        marker.unlink(missing_ok=True)
        for stale in db.parent.glob(db.name + "*"):
            stale.unlink()
        if progress:
            progress(
                f"loading {folder} into a fresh database"
                + (f" in {db.parent} ({why})" if reuse else "")
            )
    saved = _saved_keys(marker) if kept else {}
    store = SQLiteStore(db)
    try:
        if kept:
            orgs = {o.name: o.id for o in store.list_orgs()}
            if progress:
                progress(f"reusing the database in {db.parent}, loaded from the same data")
        else:
            embedder = load_embedder("onnx", 1)
            principals = load_folder(store, embedder, folder, progress)
            orgs = {name: p.org_id for name, p in principals.items()}
            extra = []
            if distractors is not None:
                extra = [
                    (f"distractor:{row['id']}", memory_draft({**row, "store": "distractors"}))
                    for row in read_jsonl(distractors / "memories.jsonl")
                ]
            for name, org_id in orgs.items():
                if extra and (used is None or name in used):
                    save_many(store, embedder, org_id, extra, author="eval", batch=1024)
                    if progress:
                        progress(f"loaded {len(extra)} distractors into {name}")
        secrets: dict[str, dict[str, str]] = {}
        out = {}
        for name, org_id in orgs.items():
            mine = saved.get(name, {})
            keys: dict[str, str] = {}
            ids: dict[str, str] = {}
            for role in (*modes, "admin"):
                secret = mine.get(role)
                if secret is None or not _valid(store, secret, org_id):
                    scopes = ADMIN if role == "admin" else READ
                    secret = mint_key(store, org_id, f"eval-{role}", scopes, frozenset()).secret
                keys[role] = secret
                ids[role] = (split_key(secret) or ("", ""))[0]
            secrets[name] = {**mine, **keys}  # a mode not replayed this time keeps its key
            out[name] = OrgKeys(
                org_id,
                {m: keys[m] for m in modes},
                keys["admin"],
                {m: ids[m] for m in modes},
            )
    finally:
        store.close()
    if reuse:
        marker.unlink(missing_ok=True)  # created anew, so readable by its owner alone
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"recipe": recipe, "loaded_from": str(folder.resolve()), "keys": secrets}, fh)
    return out


class Server:
    """`relay serve` on a loopback port over `db`; can be killed and restarted on that port."""

    def __init__(self, db: Path, log: Path) -> None:
        self.db = db
        self.log = log
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        env = {
            **os.environ,
            "RELAY_DB": str(self.db),
            # loopback whatever RELAY_HOST the shell holds for a real server (0.0.0.0 would
            # open the replay's server, and its keys' memories, to the network)
            "RELAY_HOST": "127.0.0.1",
            "RELAY_PORT": str(self.port),
            "RELAY_LOG_LEVEL": "warning",
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "relay"), "serve"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_healthy()
        except BaseException:
            # Interrupted (Ctrl-C, a CI job's SIGTERM) or never healthy: the caller holds no
            # Server yet to stop, and the server would outlive the run, in a folder removed.
            self.stop()
            raise

    def _wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RelayError(f"relay serve exited before it answered: {self._last_words()}")
            try:
                if api(self.url, "GET", "/healthz", "")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RelayError(f"relay serve did not answer in {timeout:.0f} s: {self._last_words()}")

    def _last_words(self) -> str:
        """The server log's last line: the log itself goes with a temporary workdir, and a
        setting of the shell's that serve refuses (RELAY_EMBED_THREADS=abc) is said there."""
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").split("\n")
        except OSError:
            return "no log"
        last = next((line.strip() for line in reversed(lines) if line.strip()), "no log")
        return last.removeprefix("relay: error: ")

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as when a machine or container dies."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def request(self, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
        """One API call (admin work in the drills; probes for the advice)."""
        return api(self.url, method, path, key, body)


def api(url: str, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
    """One JSON call to a Relay server: (status, decoded body or None)."""
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        data = None if body is None else json.dumps(body)
        conn.request(method, parts.path.rstrip("/") + path, data, headers)
        response = conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, None
    finally:
        conn.close()


@dataclass
class Run:
    """One hook process: what it printed, how long it took, and its own log line."""

    rc: int
    out: bytes
    ms: float
    log: dict[str, Any]

    @property
    def context(self) -> str | None:
        try:
            obj = json.loads(self.out) if self.out.strip() else None
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        return (obj.get("hookSpecificOutput") or {}).get("additionalContext")

    @property
    def injected(self) -> list[tuple[str, int]]:
        return [(str(i), int(r)) for i, r in self.log.get("injected") or ()]

    @property
    def outcome(self) -> str:
        return str(self.log.get("outcome", "missing"))

    @property
    def tokens(self) -> int:
        value = self.log.get("tokens")
        return value if type(value) is int else 0


class Hook:
    """The real `relay-hook` with its own HOME, state directory and outcome log."""

    def __init__(self, home: Path, url: str, key: str, deadline_ms: int, **env: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.env = {**hook_env(str(home), url, key, deadline_ms), **env}
        self.log_path = home / "state" / "outcomes.jsonl"
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0

    def prompt(self, prompt: str, session: str, prompt_id: str, **env: str) -> Run:
        payload = {
            "session_id": session,
            "prompt_id": prompt_id,
            "transcript_path": str(self.home / f"{session}.jsonl"),
            "cwd": str(self.home),
            "hook_event_name": "UserPromptSubmit",
            "permission_mode": "default",
            "prompt": prompt,
        }
        return self._run([str(HOOK)], payload, env)

    def session_start(self, session: str, source: str, **env: str) -> Run:
        payload = {
            "session_id": session,
            "transcript_path": str(self.home / f"{session}.jsonl"),
            "cwd": str(self.home),
            "hook_event_name": "SessionStart",
            "source": source,
        }
        return self._run([str(HOOK), "session-start"], payload, env)

    def _run(self, cmd: list[str], payload: dict[str, Any], env: dict[str, str]) -> Run:
        rc, out, ms = timed(cmd, json.dumps(payload).encode(), {**self.env, **env})
        return Run(rc, out, ms, self._new_entry())

    def _new_entry(self) -> dict[str, Any]:
        """The line this run appended (runs are sequential, so it is the only new one)."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self._offset)
                added = fh.read()
        except OSError:
            return {}
        self._offset += len(added)
        lines = [line for line in added.splitlines() if line.strip()]
        try:
            return json.loads(lines[-1]) if lines else {}
        except ValueError:
            return {}


class Held:
    """A folder one `relay eval` uses at a time: an flock on the folder itself while the run
    goes on. Two runs in one --workdir deleted and shared each other's database and hooks'
    state (figures of neither, exit 0), and two in one --report-dir each printed a report
    path that came to hold the other's report. A folder made for the run and left empty (it
    stopped early) is removed again."""

    def __init__(self, folder: Path, option: str) -> None:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(folder, os.O_RDONLY)
        except OSError as exc:
            raise InvalidRequestError(
                f"{option} {folder}: cannot make it: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise InvalidRequestError(
                f"{option} {folder}: another relay eval is using it: let it finish, or give "
                "another folder"
            ) from None
        self._made = missing

    def release(self) -> None:
        os.close(self._fd)
        for made in self._made:  # the folder first, then the parents made for it
            try:
                made.rmdir()
            except OSError:
                break


# In a --workdir: this folder is relay eval's, whose runs delete and rewrite what they keep
# there. Without it (or an older replay's relay.db.loaded.json) a folder holding anything
# is refused: a server's own relay.db there would be deleted.
WORKDIR_MARK = ".relay-eval"


def workdir(keep: Path | None, prefix: str) -> tuple[Path, Callable[[], None]]:
    """Where a run keeps its database, server log and hooks' HOMEs, and how to let it go:
    a temporary folder, removed after; or --workdir, held for this run alone (`Held`)."""
    if keep is None:
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        return Path(tmp.name), tmp.cleanup
    held = Held(keep, "--workdir")
    try:
        mark = keep / WORKDIR_MARK
        if not mark.exists():
            found = sorted(p.name for p in keep.iterdir())
            if found and "relay.db.loaded.json" not in found:
                raise InvalidRequestError(
                    f"--workdir {keep}: it holds {', '.join(found[:3])}"
                    f"{', ...' if len(found) > 3 else ''}, which no relay eval put there, and a "
                    "run deletes the relay.db (a server's database too) and homes/ it finds "
                    "there: give an empty or a new folder"
                )
            mark.write_text(
                "This folder is a relay eval --workdir: its runs delete and rewrite the "
                "relay.db*, server.log and homes/ here.\n",
                encoding="utf-8",
            )
    except OSError as exc:
        held.release()
        raise InvalidRequestError(f"--workdir {keep}: {exc.strerror or exc}") from None
    except BaseException:
        held.release()
        raise
    return keep, held.release


# The modules whose code decides what a search returns: the attempt and its stages, the
# late interaction choosing which candidates to read, and the ranker and gate judging them.
RETRIEVAL_CODE = ("relay/search.py", "relay/late.py", "relay/ranking.py")


def git_commit(repo: Path | None = None) -> dict[str, Any]:
    """Which code was measured: HEAD, and whether the files that decide recall were edited.
    `repo`: this checkout's."""
    import hashlib

    repo = repo or Path(__file__).resolve().parent.parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
            ).stdout.rstrip()  # not strip: porcelain's first line begins " M"
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = [
        line[3:]
        for line in git("status", "--porcelain", "--", "relay").splitlines()
        if line[3:].endswith(".py")
    ]
    blobs = git("hash-object", *RETRIEVAL_CODE)
    return {
        "head": git("rev-parse", "HEAD"),
        "uncommitted": sorted(dirty),
        # The retrieval code as measured, committed or not, one hash for RETRIEVAL_CODE:
        # `git hash-object relay/search.py relay/late.py relay/ranking.py | sha256sum`.
        # (Reports before it held `search_py`, search.py's alone, when ranking was in it.)
        "retrieval_code": hashlib.sha256(f"{blobs}\n".encode()).hexdigest() if blobs else "",
    }


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
