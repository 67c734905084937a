"""crawler-worker: one per machine; connects to the master and crawls what it is given."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from crawler import eventloop
from crawler.commandline import OneLineGroup, daemon_signals, version_option
from crawler.config import ConfigError
from crawler.logs import setup_logging
from crawler.resolvers.base import ResolverConfigError
from crawler.worker.config import DEFAULT_SECRET_FILE, WorkerConfig

PROG = "crawler-worker"


@click.group(PROG, cls=OneLineGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--master", envvar="CRAWLER_MASTER", help="The master's host:port [$CRAWLER_MASTER].")
@click.option("--id", "node_id", envvar="CRAWLER_ID",
              help="This node's id, one of the master's `nodes` [$CRAWLER_ID; default: the host name].")
@click.option("--data-dir", type=click.Path(path_type=Path), envvar="CRAWLER_DATA_DIR",
              help="Where pages and audio are stored [$CRAWLER_DATA_DIR; default: $STATE_DIRECTORY or "
                   "/var/lib/audio-crawler].")
@click.option("--secret-file", type=click.Path(path_type=Path), envvar="CRAWLER_SECRET_FILE",
              help=f"File holding the shared secret [$CRAWLER_SECRET_FILE; default: {DEFAULT_SECRET_FILE}].")
@click.option("--config", "config_path", type=click.Path(path_type=Path), envvar="CRAWLER_CONFIG",
              help="Optional YAML: the settings above and concurrency, User-Agent, limits, resolvers "
                   "[$CRAWLER_CONFIG].")
@click.option("--concurrency", type=int, envvar="CRAWLER_CONCURRENCY",
              help="Page fetches in flight (overrides the config) [$CRAWLER_CONCURRENCY].")
@click.option("--metrics-listen", envvar="CRAWLER_METRICS_LISTEN",
              help="host:port to serve Prometheus /metrics on (overrides the config) [$CRAWLER_METRICS_LISTEN].")
@click.option("--proxy", "proxy", multiple=True, envvar="CRAWLER_PROXY",
              help="Send this node's requests through this proxy (http://host:port or socks5://host:port; "
                   "repeatable; overrides the config's proxies, the crawl's and the sites') [$CRAWLER_PROXY, "
                   "space-separated]. Credentials go in the config's credentials_file, never here.")
@click.option("--log-level", default="info", show_default=True, envvar="CRAWLER_LOG_LEVEL",
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-file", type=click.Path(path_type=Path), envvar="CRAWLER_LOG_FILE",
              help="Log here instead of stderr; reopened on SIGHUP (for logrotate) [$CRAWLER_LOG_FILE].")
@version_option(PROG)
@click.pass_context
def main(ctx: click.Context, master: str | None, node_id: str | None, data_dir: Path | None,
         secret_file: Path | None, config_path: Path | None, concurrency: int | None, metrics_listen: str | None,
         proxy: tuple[str, ...], log_level: str, log_file: Path | None) -> None:
    """Run a crawl worker (--master is all it needs), or one of the commands below.

    Flags win over their environment variables, which win over the config file."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        setup_logging(log_level, log_file)
    except OSError as e:
        click.echo(f"{PROG}: --log-file: cannot open {log_file}: {e.strerror or e}", err=True)
        sys.exit(2)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # until the loop's handler reopens logs instead
    overrides = {"master": master, "id": node_id, "data_dir": data_dir, "secret_file": secret_file,
                 "concurrency": concurrency, "metrics_listen": metrics_listen, "proxies": list(proxy) or None}
    made: list[Path] = []
    try:
        cfg = WorkerConfig.build(config_path, overrides)
        made = _missing_dirs(cfg.data_dir)
        from crawler.worker.faults import unusable_data_dir

        problem = unusable_data_dir(cfg.data_dir)
        if problem:
            raise ConfigError("data_dir", problem)
        from crawler.worker.server import Worker

        worker = Worker(cfg)
    except (ConfigError, ResolverConfigError) as e:
        _remove_empty(made)
        click.echo(f"{PROG}: config error: {e}", err=True)
        sys.exit(2)

    async def run() -> int:
        daemon_signals(worker.stop)
        return await worker.serve()

    try:
        rc = eventloop.run(run())   # 2: the master refused this worker for good (logged as one line)
    except ConfigError as e:   # the metrics port is taken: a mistake to fix, like any config error
        _remove_empty(made)
        click.echo(f"{PROG}: config error: {e}", err=True)
        sys.exit(2)
    if rc == 2:
        _remove_empty(made)
    sys.exit(rc)


def _missing_dirs(path: Path) -> list[Path]:
    """The folders the worker will create for its data dir (the deepest first)."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def _remove_empty(made: list[Path]) -> None:
    """A worker refused at start leaves no data dir behind: what it created holds only the start-up's empty
    folders and address files, never a page or a download."""
    for d in made:
        if not d.is_dir():
            continue
        for p in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            try:
                if p.is_dir():
                    p.rmdir()
                elif p.stat().st_size == 0 or p.name.endswith(".addr"):
                    p.unlink()
            except OSError:
                return     # something of worth is there: keep it all
        try:
            d.rmdir()
        except OSError:
            return


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), envvar="CRAWLER_DATA_DIR",
              help="The worker's data dir [$CRAWLER_DATA_DIR; default: $STATE_DIRECTORY or /var/lib/audio-crawler].")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of standard output.")
@click.argument("url")
def page(data_dir: Path | None, output: Path | None, url: str) -> None:
    """Print the stored body of URL (its latest copy), from the WARC archive or the page files."""
    from crawler.worker.config import default_data_dir
    from crawler.worker.pagestore import find_page, read_page

    data_dir = data_dir or default_data_dir()

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
        try:
            output.write_bytes(body)
        except OSError as e:
            click.echo(f"{PROG}: cannot write {output}: {e.strerror or e}", err=True)
            sys.exit(2)
    else:
        sys.stdout.buffer.write(body)


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), envvar="CRAWLER_DATA_DIR",
              help="The worker's data dir [$CRAWLER_DATA_DIR; default: $STATE_DIRECTORY or /var/lib/audio-crawler].")
@click.option("--out", type=click.Path(path_type=Path), help="Write the items' evidence here, as a WACZ file.")
@click.option("--show", is_flag=True, help="Print each item's chain as text instead.")
@click.argument("items", nargs=-1, metavar="URL|SHA256...")
def evidence(data_dir: Path | None, out: Path | None, show: bool, items: tuple[str, ...]) -> None:
    """The archived chain of each item (an audio URL, its page's URL or the stored file's sha256): the page,
    the resolver's exchanges, the audio exchange and the stored bytes, bundled as WACZ (--out) or shown as text
    (--show). Reads the data dir only: works beside a running worker and on a stopped node's disk."""
    import time

    from crawler.archive import evidence as ev
    from crawler.worker.config import default_data_dir

    if not items:
        click.echo(f"{PROG}: evidence: name at least one audio URL, page URL or sha256", err=True)
        sys.exit(2)
    if show == (out is not None):
        click.echo(f"{PROG}: evidence: give --out FILE.wacz or --show (one of them)", err=True)
        sys.exit(2)
    data_dir = data_dir or default_data_dir()
    if not data_dir.is_dir():
        click.echo(f"{PROG}: evidence: no data dir at {data_dir}", err=True)
        sys.exit(2)
    try:
        index = ev.open_index(data_dir)
        if show:
            chains, text = ev.describe(index, items)
            click.echo(text)
            sys.exit(1 if ev.missing(chains) else 0)
        assert out is not None
        if not out.parent.is_dir():
            click.echo(f"{PROG}: cannot write {out}: no folder {out.parent}", err=True)
            sys.exit(2)
        chains = ev.write_bundle(index, data_dir, items, out, now=time.time())
    except (ev.EvidenceError, OSError, ValueError) as e:   # nothing archived, a bad stored file, a disk error
        click.echo(f"{PROG}: evidence: {e}", err=True)
        sys.exit(1)
    records = len({r.record_id for c in chains for r in c.records})
    click.echo(f"wrote {out}: {len(chains)} items, {records} archived records")
