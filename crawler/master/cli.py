"""crawler-master: run the master, or look at its state (status, export). Only this module exits the process."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import sys
import time
from pathlib import Path

import click

from crawler import eventloop
from crawler.config import ConfigError
from crawler.logs import setup_logging
from crawler.master.config import MasterConfig

CONFIG = click.option("--config", "config_path", required=True, type=click.Path(path_type=Path),
                      help="The master's YAML config.")


def load_config(path: Path) -> MasterConfig:
    try:
        return MasterConfig.load(path)
    except ConfigError as e:
        click.echo(f"crawler-master: config error: {e}", err=True)
        sys.exit(2)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="The master's YAML config.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, log_level: str) -> None:
    """Run the crawl master (with --config), or one of the commands below."""
    setup_logging(log_level)
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        click.echo(ctx.get_help())
        click.echo("\nError: --config is required to run the master.", err=True)
        sys.exit(2)
    cfg = load_config(config_path)
    from crawler.master.server import Master

    async def run() -> int:
        master = Master(cfg)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, master.stop)
        summary = await master.serve()
        click.echo(summary.text())
        return 0

    from crawler.master.store import StoreError

    try:
        sys.exit(eventloop.run(run()))
    except (OSError, StoreError) as e:   # port taken, data dir unwritable, another master on the same state
        click.echo(f"crawler-master: {e}", err=True)
        sys.exit(1)


def _open_store(cfg: MasterConfig):
    from crawler.master.store import MasterStore

    db = cfg.data_dir / "master.db"
    if not db.exists():
        click.echo(f"crawler-master: no crawl state at {db} (has the master run with this config?)", err=True)
        sys.exit(1)
    return MasterStore.open_readonly(db)


def _alive(pid: object) -> bool:
    """Whether the process that wrote the live view still runs (a killed master's view is soon stale anyway)."""
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: alive
        return True
    return True


@main.command()
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object (as /api/status).")
def status(config_path: Path, as_json: bool) -> None:
    """URLs by state (waiting at the master apart from at workers), workers, rates, errors, discards."""
    from crawler.master.live import LIVE_FILE, build_status, stale, status_text
    from crawler.master.observe import SNAPSHOT_INTERVAL

    cfg = load_config(config_path)
    store = _open_store(cfg)
    try:
        db = store.status()
    finally:
        store.close()
    # The running master writes its live view (connections, in flight, rates) every few seconds.
    try:
        live = json.loads((cfg.data_dir / LIVE_FILE).read_text())
    except (OSError, ValueError):
        live = None
    now = time.time()
    running = (live is not None and not stale(live, now, max_age=max(10.0, 5 * SNAPSHOT_INTERVAL))
               and _alive(live.get("pid")))
    st = build_status(db, live, cfg.nodes, now, running=running)
    if as_json:
        click.echo(json.dumps(st, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        click.echo(status_text(st))


@main.command()
@CONFIG
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of standard output.")
def export(config_path: Path, fmt: str, output: Path | None) -> None:
    """The audio catalogue, as JSON lines or CSV."""
    cfg = load_config(config_path)
    store = _open_store(cfg)
    out = open(output, "w", encoding="utf-8", newline="") if output else sys.stdout
    try:
        from crawler.master.catalogue import export_row

        rows = map(export_row, store.catalogue())
        if fmt == "jsonl":
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
        else:
            writer = None
            for row in rows:
                flat = {k: (json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v)
                        for k, v in row.items()}
                if writer is None:
                    writer = csv.DictWriter(out, fieldnames=sorted(flat), extrasaction="ignore")
                    writer.writeheader()
                writer.writerow(flat)
    finally:
        store.close()
        if output:
            out.close()
