"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb into a temporary directory, listening only on a
unix socket in that directory (no TCP port, so clusters of parallel runs never collide), stopped and removed after.

PostgreSQL refuses to run as root; as root the cluster runs as the `postgres` user that Debian's package creates.
Never touches the system's own cluster or service.

    with PgCluster.start() as pg:
        dsn = pg.create_database("crawl")          # postgresql:///crawl?host=/tmp/pg-.../&user=postgres
        standby = pg.start_standby()               # a streaming replica, synchronous: a commit is on both
        standby.promote()
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self


def pg_bin() -> Path:
    """The newest installed PostgreSQL's programs (Debian keeps them out of PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    which = shutil.which("initdb")
    if which:
        return Path(which).parent
    raise RuntimeError("PostgreSQL is not installed (scripts/setup.sh installs Debian's postgresql package)")


class PgCluster:
    def __init__(self, root: Path, data: Path, port: int, user: str | None, owns_root: bool = True) -> None:
        self.root = root            # holds the data dir(s) and the socket
        self.data = data
        self.port = port
        self.user = user            # the OS user the server runs as (None: this one)
        self._owns_root = owns_root
        self.bin = pg_bin()

    # -- running programs as the server's user --------------------------------------------------------
    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--init-groups", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "LC_ALL": "C", "PGTZ": "UTC"})

    @classmethod
    def start(cls, **settings: str) -> PgCluster:
        """initdb and start a new cluster; `settings` go into postgresql.conf."""
        user = "postgres" if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="pg-"))
        if user is not None:
            pw = pwd.getpwnam(user)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(root, 0o755)
        cluster = cls(root, root / "data", 5432, user)
        try:
            cluster._run("initdb", "-D", str(cluster.data), "-U", "postgres", "-A", "trust", "--no-sync",
                         "-E", "UTF8", "--locale=C")
            cluster._configure(wal_level="replica", max_wal_senders="4", **settings)
            cluster._start()
        except BaseException:
            cluster.remove()
            raise
        return cluster

    def _configure(self, **settings: str) -> None:
        conf = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.root}'",
            "port": str(self.port),
            "fsync": "on",
            "synchronous_commit": "on",
            "shared_buffers": "64MB",
            "max_connections": "50",
            "logging_collector": "off",
        }
        conf.update({k: str(v) for k, v in settings.items()})
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("".join(f"{k} = {v}\n" for k, v in conf.items()))
        with open(self.data / "pg_hba.conf", "a") as f:
            f.write("local replication all trust\n")

    def _start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", "120", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop", check=False)

    def kill(self) -> None:
        """The server dies at once (the machine is lost): no checkpoint, no goodbye to the standby."""
        self.stop("immediate")

    def remove(self) -> None:
        if self.data.exists() and (self.data / "postmaster.pid").exists():
            self.stop("immediate")
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- databases ------------------------------------------------------------------------------------
    def dsn(self, db: str = "postgres") -> str:
        return f"postgresql:///{db}?host={self.root}&port={self.port}&user=postgres"

    def psql(self, sql: str, db: str = "postgres") -> str:
        out = self._run("psql", "-h", str(self.root), "-p", str(self.port), "-U", "postgres", "-d", db,
                        "-v", "ON_ERROR_STOP=1", "-At", "-c", sql)
        return out.stdout.strip()

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    # -- replication ----------------------------------------------------------------------------------
    def start_standby(self) -> PgCluster:
        """A streaming replica in this cluster's root, on its own socket port; the primary then waits for it on
        every commit (synchronous_standby_names), so what a master committed is on the standby too."""
        standby = PgCluster(self.root, self.root / "standby", self.port + 1, self.user, owns_root=False)
        # --checkpoint=fast: the default spread checkpoint paces its writes over most of checkpoint_timeout
        # (minutes) once earlier tests left dirty buffers, and the backup waits for it.
        self._run("pg_basebackup", "-h", str(self.root), "-p", str(self.port), "-U", "postgres", "-D",
                  str(standby.data), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast")
        with open(standby.data / "postgresql.auto.conf", "a") as f:
            f.write(f"port = {standby.port}\ncluster_name = 'standby'\n"
                    f"primary_conninfo = 'host={self.root} port={self.port} user=postgres "
                    f"application_name=standby'\n")
        standby._start()
        self.psql("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
        self.psql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while self.psql("SELECT sync_state FROM pg_stat_replication") != "sync":
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not become synchronous")
            time.sleep(0.2)
        return standby

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "120", "promote")
