"""The `relay` command.

Server-side administration (`serve`, `org`, `key`) works on the database
directly (`--db` / RELAY_DB); everything about memories talks to a running
server over HTTP with the user's key (`--url`/`--key` or `--key-file`,
RELAY_URL/RELAY_API_KEY, or ~/.relay/config.json written by `relay install`), so it
goes through the same authorization as every agent.
"""

from __future__ import annotations

import sys

import click

from relay import __version__
from relay.errors import RelayError

# click 8.2+ raises this for a group run without a command (8.1 printed the help and
# exited 0 itself); a usage error, but its message is the whole help.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def main() -> None:
    """Entry point: Relay errors become one clear line on stderr and their exit code."""
    try:
        cli.main(standalone_mode=False, prog_name="relay")
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except _NO_ARGS_IS_HELP as exc:  # `relay`, `relay key`: the help as --help shows it, not
        exc.show()  # one line of escaped line breaks; stderr and exit 2, as click does itself
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # a usage error too: one line, its command's help named
        from relay.cli.common import error_line

        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        click.echo(f"relay: error: {error_line(exc.format_message())}{hint}", err=True)
        sys.exit(exc.exit_code)
    except RelayError as exc:
        from relay.cli.common import error_line

        click.echo(f"relay: error: {error_line(exc.message)}", err=True)
        sys.exit(exc.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="relay")
def cli() -> None:
    """Relay: team memory for coding agents."""


def _register() -> None:
    """The commands, each in the module of the concept it serves."""
    from relay.cli.admin import key, org
    from relay.cli.bench import bench
    from relay.cli.importing import import_
    from relay.cli.memories import edit, forget, history, remember, search
    from relay.cli.serve import serve
    from relay.cli.transfer import export, restore
    from relay.doctor import doctor
    from relay.drills import drill
    from relay.eval.commands import eval_group
    from relay.hook_stats import stats
    from relay.install import install
    from relay.mcp_server import mcp_command
    from relay.migrate import migrate
    from relay.skill import skill
    from relay.uninstall import uninstall

    cli.add_command(stats)
    cli.add_command(migrate)
    cli.add_command(eval_group)
    cli.add_command(drill)
    for command in (
        serve,
        org,
        key,
        remember,
        edit,
        forget,
        history,
        search,
        import_,
        export,
        restore,
        bench,
        install,
        uninstall,
        doctor,
        skill,
        mcp_command,
    ):
        cli.add_command(command)


_register()
