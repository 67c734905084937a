"""What both command lines share: one-line usage errors, --version, the signals a daemon answers."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from crawler import version
from crawler.logs import reopen_logs

_F = TypeVar("_F", bound=Callable[..., Any])


class OneLineGroup(click.Group):
    """A click group whose usage errors (unknown command, bad option) are one line and exit status 2, like config
    errors: an operator's typo deserves a sentence, not a screen of usage."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name or self.name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            message = " ".join(e.format_message().split())
            click.echo(f"{self.name}: {message} (try --help)", err=True)
            sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
        except click.Abort:
            click.echo(f"{self.name}: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def version_option(prog: str) -> Callable[[_F], _F]:
    """--version: "<prog> <version>", the version looked up only when asked (crawler.version)."""

    def show(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            click.echo(f"{prog} {version()}")
            ctx.exit()

    return click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=show,
                        help="Show the version and exit.")


def daemon_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT stop the daemon cleanly; SIGHUP reopens its log file (logrotate) instead of killing it."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    loop.add_signal_handler(signal.SIGHUP, reopen_logs)
