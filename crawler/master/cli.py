"""crawler-master: run the master, look at its state (status, export) or steer it (pause, resume, seed, retry,
references).
Only this module exits the process."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from crawler import eventloop
from crawler.commandline import OneLineGroup, daemon_signals, version_option
from crawler.config import ConfigError
from crawler.logs import setup_logging, write_summary
from crawler.master.config import MasterConfig

if TYPE_CHECKING:
    from crawler.master.store import MasterStore

PROG = "crawler-master"
CONFIG_ENV = "CRAWLER_MASTER_CONFIG"
CONFIG = click.option("--config", "config_path", required=True, type=click.Path(path_type=Path),
                      envvar=CONFIG_ENV, help=f"The master's YAML config (or ${CONFIG_ENV}).")
# How long a steering command waits for the running master to answer (it applies commands every 0.2 s).
ANSWER_TIMEOUT = 30.0


def load_config(path: Path) -> MasterConfig:
    try:
        return MasterConfig.load(path)
    except ConfigError as e:
        click.echo(f"crawler-master: config error: {e}", err=True)
        sys.exit(2)


@click.group(PROG, cls=OneLineGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(path_type=Path), envvar=CONFIG_ENV,
              help=f"The master's YAML config (or ${CONFIG_ENV}).")
@click.option("--log-level", default="info", show_default=True, envvar="CRAWLER_MASTER_LOG_LEVEL",
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-file", type=click.Path(path_type=Path), envvar="CRAWLER_MASTER_LOG_FILE",
              help="Log here instead of stderr; reopened on SIGHUP (for logrotate).")
@version_option(PROG)
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, log_level: str, log_file: Path | None) -> None:
    """Run the crawl master (with --config), or one of the commands below."""
    if (ctx.invoked_subcommand is not None
            and ctx.get_parameter_source("log_level") is click.core.ParameterSource.DEFAULT):
        # A command prints its own answer: the master's internal lines (Bloom filter loaded, operator: ...) it
        # logs on the way are noise there, unless --log-level asks for them.
        log_level = "error"
    try:
        setup_logging(log_level, log_file)
    except OSError as e:
        click.echo(f"{PROG}: --log-file: cannot open {log_file}: {e.strerror or e}", err=True)
        sys.exit(2)
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        click.echo(f"{PROG}: --config is required to run the master (try --help)", err=True)
        sys.exit(2)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # until the loop's handler reopens logs instead
    cfg = load_config(config_path)
    from crawler.master.server import Master, StartupError

    async def run() -> int:
        master = Master(cfg)
        daemon_signals(master.stop)
        summary = await master.serve()
        write_summary(summary.text(), log_file)
        return 0

    from crawler.master.store import StoreError

    try:
        sys.exit(eventloop.run(run()))
    except StartupError as e:     # port taken, data dir unusable: the operator must change something
        click.echo(f"{PROG}: {e}", err=True)
        sys.exit(2)
    except (OSError, StoreError) as e:   # another master on the same state, a failing disk
        click.echo(f"{PROG}: {e}", err=True)
        sys.exit(1)


def _open_store(cfg: MasterConfig) -> MasterStore:
    from crawler.master.store import MasterStore, StoreError

    _need_state(cfg)
    try:
        return MasterStore.open_readonly(cfg.store_location)
    except StoreError as e:
        click.echo(f"{PROG}: {e}", err=True)
        sys.exit(1)


def _need_state(cfg: MasterConfig) -> None:
    """Exit with one line when the SQLite store was never created (a PostgreSQL store says so when opened)."""
    db = cfg.store_location
    if isinstance(db, Path) and not db.exists():
        click.echo(f"{PROG}: no crawl state at {db} (has the master run with this config?)", err=True)
        sys.exit(1)


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
@click.option("--failed", is_flag=True, help="The URLs given up as errors, with the reason, not the catalogue.")
@click.option("--pages", is_flag=True,
              help="The crawl log: every URL once, with its state, last HTTP status, depth, times and reason.")
@click.option("--matches", is_flag=True,
              help="The works identified: one row per audio URL and work (per window of a live stream), with the "
                   "page, the times, the score, and for a live stream when the work was played and for how long.")
@click.option("--recordings", is_flag=True,
              help="The windows recorded of live streams (live HLS, DASH, radio): one row per window, with when it "
                   "began, its duration, its file and (for a station) the titles it played.")
@click.option("--changes-since", "since", metavar="TIME",
              help="Only the audio items that appeared, changed or were removed since TIME (ISO-8601, UTC unless "
                   "it says otherwise, or epoch seconds); each row's \"change\" says which.")
def export(config_path: Path, fmt: str, output: Path | None, failed: bool, pages: bool, matches: bool,
           recordings: bool, since: str | None) -> None:
    """The audio catalogue (or with --failed the failed URLs, with --pages the crawl log, with --matches the works
    identified, with --recordings the windows recorded of live streams), as JSON lines or CSV."""
    from crawler.logs import parse_time

    if failed + pages + matches + recordings > 1:
        click.echo(f"{PROG}: --failed, --pages, --matches and --recordings are different exports: choose one",
                   err=True)
        sys.exit(2)
    for flag, name in ((matches, "--matches"), (recordings, "--recordings")):
        if flag and since is not None:
            click.echo(f"{PROG}: --changes-since lists catalogue changes; it does not go with {name}", err=True)
            sys.exit(2)
    if pages and since is not None:
        click.echo(f"{PROG}: --changes-since lists catalogue changes; it does not go with --pages", err=True)
        sys.exit(2)

    since_t: float | None = None
    if since is not None:
        if failed:
            click.echo(f"{PROG}: --changes-since lists catalogue changes; it does not go with --failed", err=True)
            sys.exit(2)
        try:
            since_t = parse_time(since)
        except ValueError as e:
            click.echo(f"{PROG}: --changes-since: {e}", err=True)
            sys.exit(2)
    cfg = load_config(config_path)
    store = _open_store(cfg)
    out: IO[str] = sys.stdout
    if output:
        try:
            out = open(output, "w", encoding="utf-8", newline="")
        except OSError as e:
            store.close()
            click.echo(f"{PROG}: cannot write {output}: {e.strerror or e}", err=True)
            sys.exit(2)
    try:
        from crawler.logs import iso_utc
        from crawler.master.catalogue import export_row

        rows: Iterator[dict[str, Any]]
        if matches:
            from crawler.master.store import MATCH_COLUMNS
            from crawler.master.store_identify import alert_row

            _write_rows(out, map(alert_row, store.export_matches()), fmt, MATCH_COLUMNS)
            return
        if recordings:
            from crawler.master.store import RECORDING_COLUMNS

            _write_rows(out, (_recording_row(r, fmt) for r in store.export_recordings()), fmt, RECORDING_COLUMNS)
            return
        if pages:
            from crawler.master import reports

            _write_rows(out, reports.pages(store), fmt, reports.PAGE_COLUMNS)
            return
        if failed:
            rows = ({**r, "last_crawl": iso_utc(r["last_crawl"])} for r in store.failed())
        elif since_t is not None:
            rows = map(export_row, store.changes_since(since_t))
        else:
            rows = map(export_row, store.catalogue())
        if fmt == "jsonl":
            out.writelines(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)
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


def _recording_row(row: dict[str, Any], fmt: str) -> dict[str, Any]:
    """A window as the recordings export shows it: times in ISO-8601 UTC, a station's titles as JSON text in CSV."""
    from crawler.logs import iso_utc

    out = {**row, "recorded_at": iso_utc(row["recorded_at"]), "stored_at": iso_utc(row["stored_at"])}
    if fmt == "csv" and row.get("played") is not None:
        out["played"] = json.dumps(row["played"], ensure_ascii=False)
    return out


def _write_rows(out: IO[str], rows: Iterable[dict[str, Any]], fmt: str, columns: Sequence[str]) -> None:
    """Rows of flat values as JSON lines or CSV (with its header, even with no rows)."""
    if fmt == "jsonl":
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        return
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


@main.command()
@CONFIG
@click.argument("kind", type=click.Choice(["hosts", "types", "codes"]))
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of standard output.")
def report(config_path: Path, kind: str, fmt: str, output: Path | None) -> None:
    """A crawl's figures per host (pages, audio, bytes, errors, robots-blocked), per MIME type or per HTTP
    response code; read from the store, beside a running master or after it stopped."""
    from crawler.master import reports

    cfg = load_config(config_path)
    store = _open_store(cfg)
    try:
        rows = reports.REPORT_ROWS[kind](store)
    finally:
        store.close()
    try:
        out = open(output, "w", encoding="utf-8", newline="") if output else sys.stdout
    except OSError as e:
        click.echo(f"{PROG}: cannot write {output}: {e.strerror or e}", err=True)
        sys.exit(2)
    try:
        _write_rows(out, rows, fmt, reports.REPORT_COLUMNS[kind])
    finally:
        if output:
            out.close()


# ---------------------------------------------------------------------------------------------- steering
def _steer(config_path: Path, command: dict[str, Any], timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
    """Queue a command; apply it here when no master runs, else wait for the running master's answer."""
    from crawler.master import steering
    from crawler.master.server import Master
    from crawler.master.store import StoreBusy, StoreError

    cfg = load_config(config_path)
    _need_state(cfg)
    try:
        path = steering.submit(cfg.data_dir, command)
    except OSError as e:
        click.echo(f"{PROG}: cannot queue the command in {steering.commands_dir(cfg.data_dir)}: "
                   f"{e.strerror or e}", err=True)
        sys.exit(2)
    where = "the running master"
    try:
        Master(cfg).apply_offline()
        where = "applied to the stopped crawl"
    except StoreBusy:
        pass
    except (StoreError, OSError) as e:
        click.echo(f"{PROG}: {e}", err=True)
        sys.exit(1)
    deadline = time.monotonic() + timeout
    while (result := steering.take_answer(path)) is None:
        if time.monotonic() > deadline:
            click.echo(f"{PROG}: queued in {path}; the master applies it when it next runs its loop")
            sys.exit(0)
        time.sleep(0.05)
    if "error" in result:
        click.echo(f"{PROG}: {result['error']}", err=True)
        sys.exit(2)
    result["by"] = where if where != "the running master" else "applied by the running master"
    return result


@main.command()
@CONFIG
def pause(config_path: Path) -> None:
    """Stop handing out work (what is in flight finishes); the crawl stays paused across restarts."""
    r = _steer(config_path, {"command": "pause"})
    click.echo(f"paused ({r['by']})")


@main.command()
@CONFIG
def resume(config_path: Path) -> None:
    """Hand out work again after pause."""
    r = _steer(config_path, {"command": "resume"})
    click.echo(f"resumed ({r['by']})")


@main.command()
@CONFIG
@click.option("--kugou-search", "kugou_search", multiple=True, metavar="WORDS",
              help="Seed Kugou's keyword search for WORDS (a worker turns the results into song pages).")
@click.argument("urls", nargs=-1)
def seed(config_path: Path, urls: tuple[str, ...], kugou_search: tuple[str, ...]) -> None:
    """Add start URLs to the crawl, through the URL policy and dedup like any discovered link."""
    from crawler.master.config import KUGOU_SEARCH, expand_seeds
    from crawler.web.urls import host_port

    if not urls and not kugou_search:
        click.echo(f"{PROG}: seed: give at least one URL or --kugou-search WORDS", err=True)
        sys.exit(2)
    for words in kugou_search:
        if not words.strip():
            click.echo(f"{PROG}: seed: --kugou-search needs the words to search for", err=True)
            sys.exit(2)
    # The same expansion as a `kugou-search:` entry under seeds in the config.
    urls = (*urls, *expand_seeds([{KUGOU_SEARCH: words} for words in kugou_search]))
    for u in urls:
        if host_port(u) is None:
            click.echo(f"{PROG}: seed: {u!r} is not an http(s) URL", err=True)
            sys.exit(2)
    r = _steer(config_path, {"command": "seed", "urls": list(urls)})
    discarded = ", ".join(f"{k} {v}" for k, v in sorted(r["discarded"].items())) or "none"
    click.echo(f"seeded {r['added']} of {len(urls)} URLs ({r['by']}); already known {r['known']}, "
               f"discarded by policy: {discarded}")


@main.command()
@CONFIG
@click.option("--reason", help="Only the failed URLs whose error contains this text.")
def retry(config_path: Path, reason: str | None) -> None:
    """Put failed URLs (state error) back in the queue with their attempts reset."""
    r = _steer(config_path, {"command": "retry", "reason": reason})
    click.echo(f"{r['requeued']} failed URLs back in the queue ({r['by']})")


@main.command()
@CONFIG
@click.option("--out", type=click.Path(path_type=Path), help="Write the items' evidence here, as a WACZ file.")
@click.option("--show", is_flag=True, help="Print each item's chain as text instead.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds to wait for the running master's answer.")
@click.argument("items", nargs=-1, metavar="URL|SHA256...")
def evidence(config_path: Path, out: Path | None, show: bool, timeout: float, items: tuple[str, ...]) -> None:
    """The archived chain of each item (an audio URL, its page's URL or the stored file's sha256) from the
    nodes that hold it: the page, the resolver's exchanges, the audio exchange and the stored bytes, bundled as
    WACZ (--out, written by the running master) or shown as text (--show). For a node that is not connected, run
    `crawler-worker evidence --data-dir` on its machine."""
    from crawler.protocol import MAX_EVIDENCE_ITEMS

    if not items:
        click.echo(f"{PROG}: evidence: name at least one audio URL, page URL or sha256", err=True)
        sys.exit(2)
    if len(items) > MAX_EVIDENCE_ITEMS:
        click.echo(f"{PROG}: evidence: at most {MAX_EVIDENCE_ITEMS} items at a time", err=True)
        sys.exit(2)
    if show == (out is not None):
        click.echo(f"{PROG}: evidence: give --out FILE.wacz or --show (one of them)", err=True)
        sys.exit(2)
    if out is not None:
        out = out.absolute()
        if not out.parent.is_dir():
            click.echo(f"{PROG}: cannot write {out}: no folder {out.parent}", err=True)
            sys.exit(2)
    r = _steer(config_path, {"command": "evidence", "items": list(items), "out": str(out) if out else None},
               timeout=timeout)
    if show:
        click.echo(r["text"])
        sys.exit(1 if r["missing"] else 0)
    click.echo(f"wrote {r['path']}: {r['items']} items, {r['records']} archived records from "
               f"{', '.join(r['nodes'])}")


# ---------------------------------------------------------------------------------------------- references
@main.group()
def references() -> None:
    """The rights holder's reference works that the crawl's audio is matched against."""


@references.command("add")
@CONFIG
@click.option("--meta", "meta_path", type=click.Path(path_type=Path),
              help="A CSV with the columns path,work,title,artist naming the works (else a work is its file's stem).")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def references_add(config_path: Path, meta_path: Path | None, paths: tuple[Path, ...]) -> None:
    """Add works from audio files (or folders of them): fingerprinted here, then matched by the master against
    everything the crawl collected, before and after."""
    from crawler.master import references as refs

    cfg = load_config(config_path)
    _need_state(cfg)
    try:
        meta = refs.read_meta(meta_path) if meta_path else None
        files = refs.work_files(paths, meta)
        fingerprints = refs.fingerprint_all(files)
    except refs.ReferenceInputError as e:
        click.echo(f"{PROG}: {e}", err=True)
        sys.exit(2)
    added, r = 0, {}
    for command in refs.commands(files, fingerprints):
        r = _steer(config_path, command)
        added += int(r.get("added", 0))
    click.echo(f"added {added} reference works, {r.get('references', added)} in all ({r.get('by', '')})")


@references.command("list")
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="One JSON object per work.")
def references_list(config_path: Path, as_json: bool) -> None:
    """The reference works, in the order added."""
    from crawler.logs import iso_utc

    cfg = load_config(config_path)
    store = _open_store(cfg)
    try:
        rows = store.references()
    finally:
        store.close()
    for row in rows:
        row["added_at"] = iso_utc(row["added_at"])
        if as_json:
            click.echo(json.dumps(row, ensure_ascii=False, sort_keys=True))
        else:
            names = " - ".join(x for x in (row["artist"], row["title"]) if x)
            click.echo(f"{row['work']}\t{names}\t{row['source'] or ''}\t{row['added_at']}")


@references.command("remove")
@CONFIG
@click.argument("work")
def references_remove(config_path: Path, work: str) -> None:
    """Remove a work, and its matches."""
    r = _steer(config_path, {"command": "remove-reference", "work": work})
    click.echo(f"removed {r['removed']} ({r['by']})")


@main.command("upgrade-store")
@CONFIG
def upgrade_store(config_path: Path) -> None:
    """Bring a stopped crawl's store from an older crawler to this one's layout (an SQLite file is rewritten
    beside the old one, which is kept; a PostgreSQL store is upgraded in place, in one transaction)."""
    from crawler.master.store import NothingToUpgrade, StoreError, upgrade_layout, upgrade_postgres

    cfg = load_config(config_path)
    db = cfg.store_location
    try:
        if not isinstance(db, Path):
            n = upgrade_postgres(db, progress=lambda n: click.echo(f"{n:,} URLs indexed", err=True))
            click.echo(f"upgraded the PostgreSQL store: {n:,} URLs indexed")
            return
        _need_state(cfg)
        n, kept = upgrade_layout(db, progress=lambda n: click.echo(f"{n:,} URLs moved", err=True))
    except NothingToUpgrade as e:     # already done: an operator (or a script run twice) has nothing to fix
        click.echo(str(e))
        return
    except StoreError as e:
        click.echo(f"{PROG}: {e}", err=True)
        sys.exit(1)
    click.echo(f"upgraded {db}: {n:,} URLs; the old file is {kept.name} (remove it once the crawl runs)")
