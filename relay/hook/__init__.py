"""The recall hook: `relay-hook` (UserPromptSubmit) and `relay-hook session-start`.

Kept tiny: the console script imports this module on every prompt. The work is
in `relay.hook.run`; see docs/hook.md.
"""

import time

_T_IMPORT = time.monotonic()


def main(argv=None) -> int:
    """Run the hook; always return 0 and never let an exception reach the agent."""
    try:
        import sys

        from relay.hook.run import run

        run(sys.argv if argv is None else argv, _T_IMPORT)
    except BaseException:  # noqa: B036 - a hook must end with exit 0 whatever happened
        pass
    return 0
