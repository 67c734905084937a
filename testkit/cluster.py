"""Starting the real daemons as local processes (the demo and the end-to-end tests), and reading their output."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml


def free_port() -> int:
    """A loopback port free now, for a daemon whose address must be known before it starts (a master restarted
    on the same address, a worker started before its master)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_secret(path: Path, secret: str | None = None) -> Path:
    """A shared secret file as the daemons demand it: only the owner may read it, and (by default) 32 random
    bytes, base64-encoded. Created 0600 from the start, so it is never readable by others, not even briefly."""
    if secret is None:
        secret = base64.b64encode(os.urandom(32)).decode()
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    return path


def read_secret(path: Path) -> bytes:
    """The secret as the daemons read it (for tests that speak the protocol by hand)."""
    return path.read_bytes().strip()


def master_config(tmp: Path, seeds: list[str], nodes: list[str], **overrides) -> Path:
    """A master config in tmp; the shared secret is tmp/secret, made once (workers started earlier keep it)."""
    secret = tmp / "secret"
    if not secret.exists():
        write_secret(secret)
    cfg = {
        "listen": "127.0.0.1:0",
        "data_dir": str(tmp / "master"),
        "secret_file": str(secret),
        "nodes": nodes,
        "seeds": seeds,
        "exit_when_done": True,
        "scheduling": {"heartbeat_interval": 0.5, "heartbeat_timeout": 3.0, "lease_timeout": 30.0},
        "politeness": {"obey_robots": False},
        "dedup": {"expected_urls": 100_000, "fp_rate": 1e-6},
        "web": {"listen": "127.0.0.1:0"},     # never a fixed port: tests and demos run side by side
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    path = tmp / "master.yaml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


def store_of(config: Path) -> Path | str:
    """Where a master config keeps its store: its postgresql:// address, or the SQLite file in its data dir."""
    raw = yaml.safe_load(Path(config).read_text())
    return raw.get("store") or Path(raw["data_dir"]) / "master.db"


@dataclass
class Proc:
    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    stdout: bytes = b""
    args: list[str] = field(default_factory=list)
    _out_task: asyncio.Task | None = field(default=None, repr=False)

    async def wait(self, timeout: float) -> int:
        try:
            rc = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.kill()
            await self.proc.wait()
            raise AssertionError(f"{self.name} did not exit within {timeout} s; log:\n{self.log()[-4000:]}")
        if self._out_task is not None:
            self.stdout = await self._out_task
        return rc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.kill(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.kill()
                await self.proc.wait()


# Every daemon started here, so a test that fails before stopping its own leaves none running (kill_leftovers).
_spawned: list[Proc] = []


def kill_leftovers() -> list[str]:
    """SIGKILL the daemons started here that still run; their names. A failed test's master would otherwise run
    on after the suite, loading the machine, and answer a later test's commands in a data dir of the same name."""
    killed = []
    for p in _spawned:
        try:   # still ours: a pid whose exit no loop reaped could have been reused since
            alive = p.proc.returncode is None and \
                Path(f"/proc/{p.proc.pid}/cmdline").read_bytes().split(b"\0")[:3] == [
                    a.encode() for a in p.args[:3]]
        except OSError:
            alive = False
        if alive:
            os.kill(p.proc.pid, signal.SIGKILL)
            killed.append(p.name)
    _spawned.clear()
    return killed


async def _spawn(name: str, args: list[str], log_path: Path) -> Proc:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log_fh = open(log_path, "wb")
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=log_fh, env=env,
                                                stdin=asyncio.subprocess.DEVNULL)
    log_fh.close()
    p = Proc(name, proc, log_path, args=args)
    p._out_task = asyncio.ensure_future(proc.stdout.read())
    _spawned.append(p)
    return p


async def start_master(config: Path, tmp: Path, *, log_name: str = "master.log", log_level: str = "info") -> Proc:
    addr = Path(yaml.safe_load(config.read_text())["data_dir"]) / "master.addr"
    if addr.exists():
        addr.unlink()
    p = await _spawn("master", [sys.executable, "-m", "crawler.master", "--log-level", log_level,
                                "--config", str(config)], tmp / log_name)
    for _ in range(300):
        if addr.exists() and addr.read_text().strip():
            return p
        if p.proc.returncode is not None:
            break
        await asyncio.sleep(0.05)
    await p.wait(5)
    raise AssertionError(f"master did not start; log:\n{p.log()[-4000:]}")


def master_addr(config: Path) -> str:
    return (Path(yaml.safe_load(config.read_text())["data_dir"]) / "master.addr").read_text().strip()


def operator(command: str, config: Path, *args: str) -> str:
    """An operator command (`crawler-master pause --config ...`) against a running or stopped master; its output.
    Blocking: call it through asyncio.to_thread from a test's event loop."""
    done = subprocess.run([sys.executable, "-m", "crawler.master", command, "--config", str(config), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"crawler-master {command} exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def master_command(*args: str) -> str:
    """`crawler-master ARGS` (blocking: through asyncio.to_thread); its output, or an AssertionError with its
    error line."""
    done = subprocess.run([sys.executable, "-m", "crawler.master", *args], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"crawler-master {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout


def jsonl(text: str) -> list[dict]:
    """The rows of an export in JSON lines."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def store_count(db: Path, sql: str) -> int:
    """A count from a running master's SQLite store (read-only, beside its writes); 0 before the tables exist."""
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(con.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:      # the tables are not there yet
        return 0
    finally:
        con.close()


def web_url(config: Path) -> str:
    """The running master's status page (its web server listens on port 0 in tests and demos)."""
    addr = (Path(yaml.safe_load(config.read_text())["data_dir"]) / "web.addr").read_text().strip()
    return f"http://{addr}"


async def start_worker(master: str, node_id: str, tmp: Path, *, secret: Path | None = None,
                       config: Path | None = None, extra: list[str] | None = None) -> Proc:
    args = [sys.executable, "-m", "crawler.worker", "--master", master, "--id", node_id,
            "--data-dir", str(tmp / f"worker-{node_id}"), "--secret-file", str(secret or tmp / "secret")]
    if config:
        args += ["--config", str(config)]
    args += extra or []
    return await _spawn(f"worker {node_id}", args, tmp / f"worker-{node_id}.log")


async def until(predicate, timeout: float, what: str, *procs: Proc) -> None:
    """Wait for a condition another process brings about (a file grows, a log line appears); when it does not
    come, the error carries the end of each of ``procs``' logs."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + "".join(
                f"\n--- {p.name}\n{p.log()[-3000:]}" for p in procs))
        await asyncio.sleep(0.05)


def assignments(master_log: str) -> list[tuple[float, str, list[str]]]:
    """(master clock, node, URLs) of every assignment a master run with --log-level debug logged, in order."""
    out = []
    for line in master_log.splitlines():
        _, sep, rest = line.partition(" DEBUG crawler.master: assigned ")
        if sep:
            head, _, urls = rest.partition(": ")
            _n, _to, node, _at, when = head.split(" ")
            out.append((float(when), node, urls.split(" ")))
    return out


def pages_of(tmp: Path, node: str) -> list[str]:
    """The URLs a worker started by start_worker(tmp=...) has stored so far, from its page index."""
    index = tmp / f"worker-{node}" / "pages" / "index.tsv"
    if not index.exists():
        return []
    return [line.split("\t")[1] for line in index.read_text(errors="replace").splitlines() if line.count("\t") > 2]


def catalogue(tmp: Path) -> list[dict]:
    path = tmp / "master" / "catalog.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
