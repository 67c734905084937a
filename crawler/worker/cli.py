"""crawler-worker: one per machine; connects to the master and crawls what it is given."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import click

from crawler import eventloop
from crawler.config import ConfigError
from crawler.logs import setup_logging
from crawler.resolvers.base import ResolverConfigError
from crawler.worker.config import WorkerConfig


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--master", help="The master's host:port.")
@click.option("--id", "node_id", help="This node's id; must be one of the master's `nodes`.")
@click.option("--data-dir", type=click.Path(path_type=Path), help="Where pages and audio are stored.")
@click.option("--secret-file", type=click.Path(path_type=Path), help="File holding the shared secret.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Optional YAML: concurrency, User-Agent, limits, resolvers.")
@click.option("--concurrency", type=int, help="Page fetches in flight (overrides the config).")
@click.option("--metrics-listen", help="host:port to serve Prometheus /metrics on (overrides the config).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.pass_context
def main(ctx, master, node_id, data_dir, secret_file, config_path, concurrency, metrics_listen, log_level) -> None:
    """Run a crawl worker (with --master and the rest), or one of the commands below."""
    if ctx.invoked_subcommand is not None:
        return
    setup_logging(log_level)
    overrides = {"master": master, "id": node_id, "data_dir": str(data_dir) if data_dir else None,
                 "secret_file": str(secret_file) if secret_file else None, "concurrency": concurrency,
                 "metrics_listen": metrics_listen}
    try:
        cfg = WorkerConfig.build(config_path, overrides)
        from crawler.worker.server import Worker

        worker = Worker(cfg)
    except (ConfigError, ResolverConfigError) as e:
        click.echo(f"crawler-worker: config error: {e}", err=True)
        sys.exit(2)

    async def run() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        return await worker.serve()

    try:
        sys.exit(eventloop.run(run()))
    except OSError as e:   # the metrics port is taken
        click.echo(f"crawler-worker: {e}", err=True)
        sys.exit(1)


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), required=True, help="The worker's data dir.")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of standard output.")
@click.argument("url")
def page(data_dir: Path, output: Path | None, url: str) -> None:
    """Print the stored body of URL (its latest copy), from the WARC archive or the page files."""
    from crawler.worker.pagestore import find_page, read_page

    pages_dir = data_dir / "pages"
    try:
        location = find_page(pages_dir, url)
        if location is None:
            click.echo(f"crawler-worker: {url} is not in {pages_dir / 'index.tsv'}", err=True)
            sys.exit(1)
        body = read_page(pages_dir, location)
    except (OSError, ValueError) as e:
        click.echo(f"crawler-worker: {e}", err=True)
        sys.exit(1)
    if output is not None:
        output.write_bytes(body)
    else:
        sys.stdout.buffer.write(body)
