"""The recall hook: `relay-hook` (UserPromptSubmit) and `relay-hook session-start`.

Kept tiny: the console script imports this module on every prompt. The work is
in `relay.hook.run`; see docs/hook.md.
"""

import time

_T_IMPORT = time.monotonic()

TYPE_CHECKING = False  # `import typing` would cost the hook a few milliseconds
if TYPE_CHECKING:
    from typing import NoReturn


def main(argv: "list[str] | None" = None) -> "NoReturn":
    """Run the hook and end the process with status 0, whatever happened."""
    try:
        import sys

        from relay.hook.run import run

        run(sys.argv if argv is None else argv, _T_IMPORT)
    except BaseException:  # noqa: B036 - a hook must end with exit 0 whatever happened
        pass
    # Everything the hook writes went out through os.write, so nothing is left to
    # flush: skip interpreter teardown, which costs time and could still fail
    # (a stdio flush error at shutdown exits with 120) or wait on a DNS thread.
    import os

    os._exit(0)
