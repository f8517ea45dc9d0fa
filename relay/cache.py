"""Search results cached inside the authorization boundary.

The key holds the org, the API key, its roles and scopes, the retrieval
settings and the query, so no two readers with different access ever share an
entry. An entry remembers the org's generation when it was made: any write,
edit, delete or key change bumps the generation (in the database, so every
replica sees it) and the entry is dead. Expiry is a change too: an entry never
outlives the org's next `valid_until`. Callers look up only after authorizing.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Entry:
    generation: int
    expires_at: float  # epoch seconds
    value: Any


class ResultCache:
    def __init__(self, max_entries: int = 10_000, ttl_s: float = 300.0) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, generation: int) -> Any | None:
        now = time.time()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.generation != generation or entry.expires_at <= now:
                if entry is not None:
                    del self._entries[key]
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.value

    def put(self, key: Hashable, generation: int, value: Any, not_after: float | None) -> None:
        now = time.time()
        expires = now + self.ttl_s
        if not_after is not None:
            expires = min(expires, not_after)
        with self._lock:
            self._entries[key] = _Entry(generation, expires, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            # Expired entries at the cold end go now, not when the cache is full: a hook's
            # prompts are rarely asked twice, so otherwise every server filled to
            # max_entries (140 MB at 10,000 searches of the hook's 2,000 characters) and
            # held them for good.
            while self._entries:
                oldest = next(iter(self._entries.values()))
                if oldest.expires_at > now:
                    break
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
