"""One JSONL line per hook invocation in `<state_dir>/outcomes.jsonl`, rotated by size.

Each line is appended with a single O_APPEND write, so concurrent hooks never
interleave. When the file passes `log_max_bytes` the writer that holds the
rotation lock shifts outcomes.jsonl -> .1 -> .2 ... keeping `log_keep` old files.
The prompt is logged as a sha256 prefix and a length; its text only when the
user opts in with `log_prompt_text`. The key a request went with is logged by its id
(`key_label`), never its secret.
"""

from __future__ import annotations

import os
import time

from relay.hook import codec
from relay.hook.files import Lock
from relay.key_shape import split_key

LOG_NAME = "outcomes.jsonl"

try:
    from _sha256 import sha256 as _sha256  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - hashlib is the slower, portable spelling
    from hashlib import sha256 as _sha256


def sha256_hex(data: bytes) -> str:
    return _sha256(data).hexdigest()


def key_label(key: str) -> str:
    """Which key a run sent, never its secret: the id of a key shaped `relay_<id>_<secret>`
    as the server reads one (`split_key`; what `relay keys` and `relay doctor` show), else
    `sha256:` and 8 hex digits of it, so `relay stats` can tell whose 401s they were
    (docs/hook.md)."""
    parts = split_key(key)
    return parts[0] if parts else "sha256:" + sha256_hex(key.encode())[:8]


def timestamp(now: float | None = None) -> str:
    """UTC ISO 8601 with milliseconds, without importing datetime."""
    now = time.time() if now is None else now
    millis = int(now * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{millis:03d}Z"


def fallback_dir(environ) -> str:
    """Where a hook that cannot write its state folder logs instead (each line naming the
    folder it was given), so `relay stats` and `relay doctor` still see its runs: a private
    folder of this user's in the temporary directory."""
    return os.path.join(environ.get("TMPDIR") or "/tmp", f"relay-hook-{os.getuid()}")


def append(state_dir: str, entry: dict, max_bytes: int, keep: int) -> None:
    path = os.path.join(state_dir, LOG_NAME)
    line = (codec.dumps(entry) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, line)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > max_bytes:
        rotate(state_dir, max_bytes, keep)


def rotate(state_dir: str, max_bytes: int, keep: int) -> None:
    """Shift the log files by one; skipped when another process is rotating or just did."""
    path = os.path.join(state_dir, LOG_NAME)
    with Lock(os.path.join(state_dir, "outcomes.lock"), time.monotonic()) as lock:
        try:
            if not lock.held or os.stat(path).st_size <= max_bytes:
                return
        except OSError:
            return
        for n in range(keep - 1, 0, -1):
            try:
                os.replace(f"{path}.{n}", f"{path}.{n + 1}")
            except FileNotFoundError:
                pass
        try:
            os.replace(path, f"{path}.1")
        except FileNotFoundError:
            pass
        # Files past `keep`, left by a larger `log_keep` before, would stay for good (and be
        # read by `relay stats`, which reads every file numbered on from .1).
        n = keep + 1
        while True:
            try:
                os.unlink(f"{path}.{n}")
            except OSError:  # none left (or one this user may not remove: left as it is)
                break
            n += 1
