"""What a memory id may be: made by relay.writes, given to a create (the API's `id`) or
derived by relay import, and what a client may put in one path segment of a URL. Kept apart
so the CLI's client can check an id without loading the write path or the secret patterns."""

from __future__ import annotations

import re

MEMORY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
