"""The two databases the master store runs on, behind one small connection interface.

The store (crawler/master/store.py) holds every query and all of the logic once; a backend only knows how to
open its database, identify it as ours, lock it against a second master, and spell the few things the two
dialects spell differently: placeholders, a list parameter, a few type names, a function name, a snapshot.

SQLite is the embedded default: one file in the data dir, WAL mode, an flock beside it. PostgreSQL is for a crawl
whose state outgrows one machine's disk, or that must survive the loss of the master's machine: the master holds
a session advisory lock (it dies with the connection, like the flock), every commit is a real PostgreSQL commit,
and a standby promoted after a failover carries the same state to a master started anywhere.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec

# PRAGMA application_id marks an SQLite file as ours ("ACRW"), so a stray SQLite file is refused, not altered;
# the same number is the advisory lock a PostgreSQL master holds.
APPLICATION_ID = 0x41435257
_PG_SCHEMES = ("postgresql://", "postgres://")


class StoreError(Exception):
    """The store cannot be used as asked: not our database, a newer schema, held by another master, read-only."""


class StoreBusy(StoreError):
    """Another master process holds the store."""


class StoreUnreachable(StoreError):
    """The database server did not answer: it may come back, so a master that meets this at start is restarted,
    where every other StoreError at start is a mistake to fix."""


class ReadOnlyStoreError(StoreError, sqlite3.OperationalError):
    """A write through a store opened with open_readonly()."""


class StoreValueError(StoreError, ValueError):
    """The database refused a value (an integer past 64 bits, say): the caller's data, not the store, is at fault."""


# What sqlite3 raises for a statement: its own errors, and OverflowError for an integer it cannot bind.
_SQLITE_ERRORS = (sqlite3.Error, OverflowError)


_encode_json = msgspec.json.Encoder().encode


def json_array(values: list[Any]) -> str:
    """A list parameter as JSON text (tuples as arrays), by msgspec's encoder: 0.2 us for a report's 16 keys,
    where json.dumps took 3, a few times a report. The database reads the same values (the text has no blanks,
    and UTF-8 where json.dumps wrote \\u escapes); what msgspec cannot encode (a lone surrogate, an integer
    past 64 bits) goes to json.dumps, as before."""
    try:
        return _encode_json(values).decode()
    except Exception:
        return json.dumps(values)


def is_postgres(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(_PG_SCHEMES)


_UNREADABLE_DSN = ("postgresql:// address that libpq reads differently from how it looks (write '@', '/', '?' "
                   "and '#' in a user name or password as %40, %2F, %3F and %23)")


def dsn_problem(dsn: str) -> str | None:
    """Why this postgresql:// address cannot be used safely, or None. A raw '@' or '/' in a password makes libpq
    read part of it as the host, port or database name, which errors then print; such an address is refused
    (never echoed: its text holds the password)."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    rest = dsn.split("://", 1)[1]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if authority.count("@") > 1 or "@" in rest[len(authority):]:
        return f"a {_UNREADABLE_DSN}"
    try:
        conninfo_to_dict(dsn)
    except Error:      # its message quotes the whole address
        return f"not a valid {_UNREADABLE_DSN}"
    return None


def describe(location: str | Path) -> str:
    """The location for messages, the one place a store address is made printable: a PostgreSQL address is
    parsed as libpq parses it (psycopg.conninfo) and shown with its password, wherever it was given (user info,
    ?password=, percent-encoded or not), as ***; one that does not parse cleanly is not shown at all."""
    if not is_postgres(location):
        return str(location)
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn = str(location)
    if dsn_problem(dsn) is not None:
        return "postgresql://(an address that does not parse cleanly: not shown)"
    parts = conninfo_to_dict(dsn)
    if "password" in parts:
        parts["password"] = "***"
    return make_conninfo("", **parts)


def _password(location: str) -> str | None:
    """The password a PostgreSQL address carries, so an error message that quotes it can be scrubbed."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    try:
        value = conninfo_to_dict(location).get("password")
    except Error:
        return None
    return str(value) if value else None


def take_lock(path: Path) -> int:
    """Hold `<path>.lock` for this process (an fd to close to let go), or StoreBusy.

    Two masters on one store would each trust their own in-memory counters; refuse the second. flock dies with
    the process, so a killed master never leaves a stale lock behind."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreBusy(f"{path}: in use by another master process") from None
    return fd


class Backend:
    """One open connection. SQL is written with `?` placeholders; rows come back as tuples."""

    name = ""
    where = ""
    readonly = False
    # Type names in the shared DDL: {INT} is a 64-bit integer, {REAL} a double, {AUTO_ID} an increasing key, {BLOB}
    # bytes.
    types: ClassVar[dict[str, str]] = {}
    strpos = ""
    like = "LIKE"          # case-insensitive LIKE (SQLite's LIKE ignores ASCII case; PostgreSQL's does not)

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        raise NotImplementedError

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        """The statement once per row; returns how many rows the statements changed in all."""
        raise NotImplementedError

    def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """Every row of a query, its errors mapped to ours wherever they arise (SQLite may raise one while the rows
        are fetched, a query cut off by limit_time, say, not only when the query starts)."""
        return list(self.execute(sql, args).fetchall())

    def script(self, sql: str) -> None:
        raise NotImplementedError

    @property
    def in_transaction(self) -> bool:
        raise NotImplementedError

    def start_writing(self) -> None:
        """The store is ours and current: set up for writing."""

    def begin(self) -> None:
        """A write transaction (taking the write lock at once, so a commit never fails on a busy database)."""
        raise NotImplementedError

    def begin_snapshot(self) -> None:
        """A read transaction that sees one commit throughout."""
        self.execute("BEGIN")

    def in_list(self, column: str) -> str:
        """`column` is one of a list given as one parameter (see list_arg)."""
        raise NotImplementedError

    def json_text(self, column: str, key: str) -> str:
        """The text at `key` of the JSON object in `column` (NULL when absent)."""
        raise NotImplementedError

    def in_pairs(self, first: str, second: str) -> str:
        """(`first`, `second`) is one of a list of pairs of text given as one parameter (see pairs_arg): an index
        on the two columns is searched once per pair, where two in_list()s search it for every combination."""
        raise NotImplementedError

    def pairs_arg(self, pairs: Iterable[tuple[str, str]]) -> Any:
        return json_array(list(pairs))

    def list_arg(self, values: Sequence[Any]) -> Any:
        raise NotImplementedError

    def columns(self, table: str) -> set[str]:
        raise NotImplementedError

    def unique_keys(self, table: str) -> dict[str, tuple[str, ...]]:
        """The table's UNIQUE constraints: name -> its columns, in order."""
        raise NotImplementedError

    def indexes(self, table: str) -> set[str]:
        """The names of the table's indexes."""
        raise NotImplementedError

    def schema_version(self) -> int | None:
        """The schema version of our database, None for an empty one; StoreError for anything else."""
        raise NotImplementedError

    def create(self, ddl: str, version: int) -> None:
        raise NotImplementedError

    def limit_time(self, seconds: float) -> None:
        """Queries from now on are cut off after `seconds` (the status page's search)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def ddl(self, text: str) -> str:
        return text.format(**self.types)


class SqliteBackend(Backend):
    name = "sqlite"
    types: ClassVar[dict[str, str]] = {
        "INT": "INTEGER", "REAL": "REAL", "AUTO_ID": "INTEGER PRIMARY KEY", "WITHOUT_ROWID": "WITHOUT ROWID",
        "BLOB": "BLOB"}
    strpos = "instr"

    def __init__(self, path: Path, *, readonly: bool, cache_mb: int = 64, checkpoint_pages: int = 10_000) -> None:
        self.path = path
        self.where = str(path)
        self.readonly = readonly
        self._checkpoint_pages = checkpoint_pages
        self._lock_fd: int | None = None
        if readonly:
            if not path.exists():
                raise StoreError(f"{path}: no such store")
            self._check_header()
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._check_header()
            self._take_lock()
            # The master ends its transactions on a thread of its own (MasterStore.end_transaction), so the
            # connection is used from two threads, one at a time; SQLite serialises them anyway.
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA busy_timeout = 5000")
            self.db.execute(f"PRAGMA cache_size = {-cache_mb * 1024}")
        except sqlite3.DatabaseError as e:
            self.close()
            raise StoreError(f"{path}: not a crawl database ({e})") from e

    def _check_header(self) -> None:
        # sqlite3 opens anything lazily and only fails on the first query with a terse message; look first.
        try:
            with open(self.path, "rb") as f:
                head = f.read(16)
        except FileNotFoundError:
            return
        if head and head != b"SQLite format 3\x00":
            raise StoreError(f"{self.path}: not a crawl database (not an SQLite file)")

    def _take_lock(self) -> None:
        self._lock_fd = take_lock(self.path)

    def start_writing(self) -> None:
        # Only once the file is known to be ours and current: WAL mode rewrites the header of the file.
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.execute(f"PRAGMA wal_autocheckpoint = {self._checkpoint_pages}")
        # Each report is a unit with a savepoint of its own (StoreCore.atomic): the pages it changes are copied to
        # a sub-journal, which SQLite keeps in a temporary file past 64 KiB, unless temporary storage is memory.
        # A report's sub-journal is small (its part is bounded: server.REPORT_PART, PART_LINKS), but in a file it
        # cost six pwrites per page crawled and a file made and deleted per transaction: about 10 us of system
        # time per page, near a tenth of the master's CPU on the page path. Set here, once the layout is current
        # (start_writing comes after an upgrade), so that an upgrade's index builds still sort on disk.
        self.db.execute("PRAGMA temp_store = MEMORY")

    def execute(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        try:
            return self.db.execute(sql, args)
        except _SQLITE_ERRORS as e:
            raise self._wrap(e) from e

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        try:
            return self.db.executemany(sql, rows).rowcount
        except _SQLITE_ERRORS as e:
            raise self._wrap(e) from e

    def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            return self.db.execute(sql, args).fetchall()
        except _SQLITE_ERRORS as e:
            raise self._wrap(e) from e

    def script(self, sql: str) -> None:
        try:
            self.db.executescript(sql)
        except _SQLITE_ERRORS as e:
            raise self._wrap(e) from e

    def _wrap(self, e: Exception) -> Exception:
        """sqlite3's errors as ours, as PostgresBackend._wrap maps psycopg's: a value the database cannot hold
        (an integer past 64 bits, a broken constraint) is StoreValueError, anything else a StoreError."""
        if isinstance(e, (OverflowError, sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError)):
            return StoreValueError(f"{self.where}: value refused ({_first_line(e)})")
        if isinstance(e, sqlite3.OperationalError):
            if self.readonly and "readonly" in str(e):
                return ReadOnlyStoreError(f"{self.where}: opened read-only")
            return StoreError(f"{self.where}: {_first_line(e)}")
        return StoreError(f"{self.where}: not a crawl database ({_first_line(e)})")

    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def begin(self) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.path}: opened read-only")
        self.db.execute("BEGIN IMMEDIATE")

    def in_list(self, column: str) -> str:
        return f"{column} IN (SELECT value FROM json_each(?))"

    def json_text(self, column: str, key: str) -> str:
        return f"json_extract({column}, '$.{key}')"

    def in_pairs(self, first: str, second: str) -> str:
        return (f"({first}, {second}) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') "
                "FROM json_each(?))")

    def list_arg(self, values: Sequence[Any]) -> Any:
        return json_array(list(values))

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}

    def unique_keys(self, table: str) -> dict[str, tuple[str, ...]]:
        return {name: tuple(r[2] for r in sorted(self.db.execute(f"PRAGMA index_info('{name}')")))
                for _, name, unique, origin, *_ in self.db.execute(f"PRAGMA index_list({table})")
                if unique and origin == "u"}

    def indexes(self, table: str) -> set[str]:
        return {row[1] for row in self.db.execute(f"PRAGMA index_list({table})")}

    def schema_version(self) -> int | None:
        try:
            app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if app_id == 0 and version == 0:
                if self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise StoreError(f"{self.path}: an SQLite database, but not a crawl database")
                return None
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a crawl database ({e})") from e
        if app_id != APPLICATION_ID:
            raise StoreError(f"{self.path}: an SQLite database, but not a crawl database")
        return int(version)

    def create(self, ddl: str, version: int) -> None:
        # One transaction, so a crash mid-creation leaves an empty file, not half a schema.
        self.db.executescript(f"BEGIN IMMEDIATE; {self.ddl(ddl)}; PRAGMA application_id = {APPLICATION_ID}; "
                              f"PRAGMA user_version = {version}; COMMIT;")

    def set_version(self, version: int) -> None:
        self.db.execute(f"PRAGMA user_version = {version}")

    def limit_time(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        # Called every 10,000 SQLite instructions: a non-zero answer interrupts the query.
        self.db.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)

    def close(self) -> None:
        try:
            if getattr(self, "db", None) is not None:
                self.db.close()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


class PostgresBackend(Backend):
    name = "postgresql"
    types: ClassVar[dict[str, str]] = {
        "INT": "BIGINT", "REAL": "DOUBLE PRECISION", "AUTO_ID": "BIGSERIAL PRIMARY KEY", "WITHOUT_ROWID": "",
        "BLOB": "BYTEA"}
    strpos = "strpos"
    like = "ILIKE"

    # How long a new master waits for the advisory lock: a killed master's session ends as soon as its server
    # process sees the connection close, which takes a moment. Past this, another master holds it.
    LOCK_WAIT = 2.0

    def __init__(self, dsn: str, *, readonly: bool, connect_timeout: float = 10.0) -> None:
        import psycopg

        self._pg = psycopg
        self.where = describe(dsn)
        self._secret = _password(dsn)
        self.readonly = readonly
        self._sql: dict[str, str] = {}
        try:
            self.db = psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(connect_timeout)))
        except psycopg.Error as e:
            raise StoreUnreachable(f"{self.where}: cannot connect ({self._first_line(e)})") from None
        try:
            if readonly:
                self.db.execute("SET default_transaction_read_only = on")
            else:
                # A master whose machine died leaves its session (and lock) behind until the server notices:
                # keepalives from the server's side make that seconds, not the system's default of hours.
                for name, value in (("tcp_keepalives_idle", 10), ("tcp_keepalives_interval", 5),
                                    ("tcp_keepalives_count", 3)):
                    self.db.execute(f"SET {name} = {value}")
                self._lock()
        except psycopg.Error as e:
            self.db.close()
            raise StoreError(f"{self.where}: {self._first_line(e)}") from None
        except BaseException:
            self.db.close()
            raise

    def _first_line(self, e: BaseException) -> str:
        """psycopg's message, with the password taken out should the server or libpq quote it."""
        line = _first_line(e)
        return line.replace(self._secret, "***") if self._secret else line

    def _lock(self) -> None:
        # Refuse a second master, as the flock does for SQLite; the lock goes with the connection.
        deadline = time.monotonic() + self.LOCK_WAIT
        while True:
            got = self.db.execute("SELECT pg_try_advisory_lock(%s)", (APPLICATION_ID,)).fetchone()
            if got and got[0]:
                return
            if time.monotonic() > deadline:
                raise StoreBusy(f"{self.where}: in use by another master process")
            time.sleep(0.1)

    def _q(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            out = self._sql[sql] = sql.replace("%", "%%").replace("?", "%s")
        return out

    def _wrap(self, e: Exception) -> Exception:
        pg = self._pg
        if isinstance(e, pg.errors.ReadOnlySqlTransaction):
            return ReadOnlyStoreError(f"{self.where}: opened read-only")
        if isinstance(e, pg.errors.QueryCanceled):
            return StoreError(f"{self.where}: query cut off ({_first_line(e)})")
        if isinstance(e, (pg.DataError, pg.IntegrityError)) or (
                isinstance(e, pg.ProgrammingError) and not isinstance(e, pg.errors.UndefinedTable)):
            return StoreValueError(f"{self.where}: value refused ({_first_line(e)})")
        if isinstance(e, pg.OperationalError):
            return StoreError(f"{self.where}: {_first_line(e)}")
        return e

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        try:
            return self.db.execute(self._q(sql), args or None, prepare=False if not args else None)
        except self._pg.Error as e:
            raise self._wrap(e) from e

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        rows = list(rows)
        if not rows:
            return 0
        try:
            with self.db.cursor() as cur:
                cur.executemany(self._q(sql), rows)
                return int(cur.rowcount)      # of every row's statement (psycopg >= 3.1)
        except self._pg.Error as e:
            raise self._wrap(e) from e

    def script(self, sql: str) -> None:
        try:
            self.db.execute(sql)
        except self._pg.Error as e:
            raise self._wrap(e) from e

    @property
    def in_transaction(self) -> bool:
        return self.db.info.transaction_status != self._pg.pq.TransactionStatus.IDLE

    def begin(self) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.where}: opened read-only")
        self.execute("BEGIN")

    def begin_snapshot(self) -> None:
        self.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def in_list(self, column: str) -> str:
        return f"{column} = ANY(?)"

    def json_text(self, column: str, key: str) -> str:
        return f"({column}::jsonb ->> '{key}')"

    def in_pairs(self, first: str, second: str) -> str:
        return f"({first}, {second}) IN (SELECT x ->> 0, x ->> 1 FROM jsonb_array_elements(?::jsonb) AS x)"

    def list_arg(self, values: Sequence[Any]) -> Any:
        return list(values)

    def columns(self, table: str) -> set[str]:
        return {r[0] for r in self.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ?", (table,))}

    def unique_keys(self, table: str) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for name, column in self.execute(
                "SELECT c.conname, a.attname FROM pg_constraint c "
                "CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n) "
                "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum "
                "WHERE c.conrelid = to_regclass(?::text) AND c.contype = 'u' ORDER BY c.conname, k.n", (table,)):
            out[name] = (*out.get(name, ()), column)
        return out

    def indexes(self, table: str) -> set[str]:
        return {r[0] for r in self.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ?", (table,))}

    def schema_version(self) -> int | None:
        tables = {r[0] for r in self.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
        if not tables:
            return None
        if "meta" not in tables:
            raise StoreError(f"{self.where}: a PostgreSQL database, but not a crawl database")
        rows = dict(self.execute("SELECT key, value FROM meta WHERE key IN ('application_id', 'schema_version')"))
        if rows.get("application_id") != str(APPLICATION_ID):
            raise StoreError(f"{self.where}: a PostgreSQL database, but not a crawl database")
        return int(rows.get("schema_version", "0"))

    def create(self, ddl: str, version: int) -> None:
        if self.readonly:
            raise StoreError(f"{self.where}: empty database, not a crawl database")
        self.execute("BEGIN")
        try:
            self.script(self.ddl(ddl))
            self.executemany("INSERT INTO meta(key, value) VALUES (?, ?)",
                             [("application_id", str(APPLICATION_ID)), ("schema_version", str(version))])
            self.execute("COMMIT")
        except BaseException:
            self.execute("ROLLBACK")
            raise

    def limit_time(self, seconds: float) -> None:
        self.execute(f"SET statement_timeout = {max(1, int(seconds * 1000))}")

    def close(self) -> None:
        self.db.close()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def open_backend(location: str | Path, *, readonly: bool, cache_mb: int = 64,
                 checkpoint_pages: int = 10_000) -> Backend:
    if is_postgres(location):
        return PostgresBackend(str(location), readonly=readonly)
    return SqliteBackend(Path(location), readonly=readonly, cache_mb=cache_mb, checkpoint_pages=checkpoint_pages)
