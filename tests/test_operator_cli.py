"""The command lines as an operator meets them: every mistake one line and exit 2, --version, the worker's
defaults and environment variables, paths from where they were given, SIGHUP for logrotate."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from crawler import __version__
from crawler.master.store import MasterStore
from crawler.worker.config import WorkerConfig
from testkit.cluster import write_secret


def run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, timeout=60,
                          check=False, env=env)


def one_line(r: subprocess.CompletedProcess, words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr


def master_yaml(tmp: Path, **changes) -> Path:
    raw = {"listen": "127.0.0.1:0", "data_dir": "state", "secret_file": str(write_secret(tmp / "secret")),
           "nodes": ["w1"], "seeds": ["http://127.0.0.1:9/"], "web": {"listen": "127.0.0.1:0"}}
    for key, value in changes.items():
        if isinstance(value, dict):
            raw.setdefault(key, {}).update(value)
        else:
            raw[key] = value
    path = tmp / "master.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("section, key", [("crawl", "allow_patterns"), ("crawl", "deny_patterns"),
                                          ("crawl", "keep_fragment"), ("dedup", "whitelist")])
def test_a_bad_regex_is_one_line_before_any_state_is_written(tmp_path, section, key):
    cfg = master_yaml(tmp_path, **{section: {key: ["ok", "(unclosed"]}})
    r = run(["crawler.master", "--config", str(cfg)], tmp_path)
    one_line(r, f"{section}.{key}: '(unclosed' is not a valid regular expression")
    assert not (tmp_path / "state").exists()


def test_a_taken_port_fails_before_seeding(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = master_yaml(tmp_path, listen=f"127.0.0.1:{taken.getsockname()[1]}")
        r = run(["crawler.master", "--config", str(cfg)], tmp_path)
    one_line(r, "cannot listen on 127.0.0.1:")
    assert not (tmp_path / "state" / "master.db").exists()
    # The status page's port too.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = master_yaml(tmp_path, web={"listen": f"127.0.0.1:{taken.getsockname()[1]}"})
        r = run(["crawler.master", "--config", str(cfg)], tmp_path)
    one_line(r, "cannot listen on web.listen 127.0.0.1:")
    assert not (tmp_path / "state" / "master.db").exists()


def test_version_and_unknown_commands(tmp_path):
    for prog, module in (("crawler-master", "crawler.master"), ("crawler-worker", "crawler.worker")):
        r = run([module, "--version"], tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == f"{prog} {__version__}", r
        one_line(run([module, "frobnicate"], tmp_path), f"{prog}: No such command 'frobnicate'")
        one_line(run([module, "--no-such-flag"], tmp_path), "No such option")


def test_export_to_an_unwritable_path_and_commands_without_state(tmp_path):
    cfg = master_yaml(tmp_path)
    MasterStore(tmp_path / "state" / "master.db").close()
    one_line(run(["crawler.master", "export", "--config", str(cfg), "-o", "/nonexistent/x.csv"], tmp_path),
             "cannot write /nonexistent/x.csv: No such file or directory")
    one_line(run(["crawler.master", "seed", "--config", str(cfg), "ftp://x/"], tmp_path),
             "seed: 'ftp://x/' is not an http(s) URL")
    r = run(["crawler.master", "export", "--failed", "--config", str(cfg)], tmp_path)
    assert r.returncode == 0 and r.stdout == "", r.stderr


def test_seed_by_kugou_keywords_on_a_stopped_crawl(tmp_path):
    cfg = master_yaml(tmp_path, crawl={"allowed_hosts": ["127.0.0.1:9", "songsearch.kugou.com"]})
    MasterStore(tmp_path / "state" / "master.db").close()
    one_line(run(["crawler.master", "seed", "--config", str(cfg)], tmp_path),
             "seed: give at least one URL or --kugou-search WORDS")
    r = run(["crawler.master", "seed", "--config", str(cfg), "--kugou-search", "Some  Band"], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("seeded 1 of 1 URLs"), (r.stdout, r.stderr)
    store = MasterStore.open_readonly(tmp_path / "state" / "master.db")
    try:
        assert store.known(["https://songsearch.kugou.com/song_search_v2?keyword=Some+Band&page=1&pagesize=30"])
    finally:
        store.close()


def test_unusable_worker_data_dirs(tmp_path):
    secret = write_secret(tmp_path / "secret")
    (tmp_path / "afile").write_text("x")
    for data_dir, words in ((tmp_path / "afile", "afile is not a directory"),
                            (tmp_path / "afile" / "below", "cannot use")):
        r = run(["crawler.worker", "--master", "127.0.0.1:9", "--id", "w1", "--data-dir", str(data_dir),
                 "--secret-file", str(secret)], tmp_path)
        one_line(r, words)
    r = run(["crawler.worker", "--master", "nowhere", "--secret-file", str(secret)], tmp_path)
    one_line(r, "master: expected host:port, got 'nowhere'")


def test_worker_defaults_environment_and_relative_paths(tmp_path, monkeypatch):
    etc = tmp_path / "etc"
    etc.mkdir()
    write_secret(etc / "secret")
    (etc / "worker.yaml").write_text("master: 127.0.0.1:7700\nsecret_file: secret\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    # Paths in the file are taken from the file's folder; on the command line, from the current directory.
    cfg = WorkerConfig.build(Path("etc/worker.yaml"), {})
    assert cfg.master == ("127.0.0.1", 7700) and cfg.id == socket.gethostname()
    assert cfg.data_dir == tmp_path / "state"
    cfg = WorkerConfig.build(Path("etc/worker.yaml"), {"secret_file": "etc/secret", "data_dir": "here"})
    assert cfg.data_dir == tmp_path / "here"
    monkeypatch.delenv("STATE_DIRECTORY")
    assert WorkerConfig.build(Path("etc/worker.yaml"), {}).data_dir == Path("/var/lib/audio-crawler")
    # Environment variables stand for flags: a missing secret at the default place is named.
    env = dict(os.environ, CRAWLER_MASTER="127.0.0.1:9", CRAWLER_ID="w1", CRAWLER_DATA_DIR=str(tmp_path / "d"))
    env.pop("CRAWLER_SECRET_FILE", None)
    env.pop("CRAWLER_CONFIG", None)
    r = run(["crawler.worker"], tmp_path, env=env)
    one_line(r, "secret_file: cannot read /etc/audio-crawler/secret")
    r = run(["crawler.worker", "--secret-file", "etc/secret", "--config", "etc/worker.yaml", "--log-level",
             "nonsense"], tmp_path, env=env)
    one_line(r, "Invalid value for '--log-level'")


def test_sighup_reopens_the_log_file_and_the_master_carries_on(tmp_path):
    cfg = master_yaml(tmp_path)
    log = tmp_path / "master.log"
    proc = subprocess.Popen([sys.executable, "-m", "crawler.master", "--log-file", str(log), "--config", str(cfg)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while "master listening" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        log.rename(tmp_path / "master.log.1")          # what logrotate does
        proc.send_signal(signal.SIGHUP)
        while not log.exists() or "log file reopened" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "the master did not reopen its log"
            time.sleep(0.05)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    # The end summary goes where the log goes, not to a terminal nobody watches under systemd.
    assert proc.returncode == 0 and out == "" and err == "", (out, err)
    assert "crawl summary" in log.read_text() and "pages fetched" in log.read_text()


def test_a_read_only_data_dir_is_a_mistake_at_start(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        r = run(["crawler.worker", "--master", "127.0.0.1:9", "--id", "w1", "--data-dir", str(ro),
                 "--secret-file", str(write_secret(tmp_path / "secret"))], tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    one_line(r, "Read-only file system")


# ------------------------------------------------------------------------ refusals: one line, exit 2
def start_master(cfg: Path, tmp: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "crawler.master", "--config", str(cfg)], cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    addr = tmp / "state" / "master.addr"
    deadline = time.monotonic() + 60
    while not (addr.exists() and addr.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return proc, addr.read_text().strip()


def worker_args(addr: str, node: str, data_dir: Path, secret: Path, *extra: str) -> list[str]:
    return ["crawler.worker", "--master", addr, "--id", node, "--data-dir", str(data_dir), "--secret-file",
            str(secret), *extra]


def test_refused_workers_leave_no_data_dir_and_a_stopped_worker_says_it_stopped(tmp_path):
    cfg = master_yaml(tmp_path, exit_when_done=False)
    master, addr = start_master(cfg, tmp_path)
    try:
        secret = tmp_path / "secret"
        # Refused by the master (an id not in its nodes): exit 2, one error, nothing left on disk.
        r = run(worker_args(addr, "w9", tmp_path / "data" / "w9", secret), tmp_path)
        assert r.returncode == 2, r.stderr
        errors = [line for line in r.stderr.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "not in the master's nodes list" in errors[0], r.stderr
        assert not (tmp_path / "data").exists()
        # A taken metrics port: the key named, no raw errno, nothing left on disk.
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            r = run(worker_args(addr, "w1", tmp_path / "data" / "w1", secret, "--metrics-listen",
                                f"127.0.0.1:{port}"), tmp_path)
        lines = [line for line in r.stderr.strip().splitlines() if " INFO " not in line]
        assert r.returncode == 2 and lines == [f"crawler-worker: config error: metrics_listen: cannot listen on "
                                               f"127.0.0.1:{port}: Address already in use"], r.stderr
        assert not (tmp_path / "data").exists()
        # Stopped by SIGTERM: it says so, with readable figures, and exits 0.
        worker = subprocess.Popen([sys.executable, "-m", *worker_args(addr, "w1", tmp_path / "w1", secret)],
                                  cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = []
        while not seen or "connected to master" not in seen[-1]:
            seen.append(worker.stderr.readline())
            assert seen[-1], f"the worker did not connect: {seen}"
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        err = "".join(seen) + err
        assert worker.returncode == 0, err
        assert "stopping: connection to the master closed" in err and "connection to the master lost" not in err, err
        stopped = next(line for line in err.splitlines() if "worker w1 stopped:" in line)
        assert "DownloadStats(" not in stopped and "downloads: 0 fetched, 0 reused" in stopped, stopped
    finally:
        master.send_signal(signal.SIGTERM)
        master.communicate(timeout=60)


def test_upgrade_store_with_nothing_to_do_exits_0(tmp_path):
    cfg = master_yaml(tmp_path)
    MasterStore(tmp_path / "state" / "master.db").close()
    r = run(["crawler.master", "upgrade-store", "--config", str(cfg)], tmp_path)
    assert r.returncode == 0 and "nothing to upgrade" in r.stdout and r.stderr == "", r


def test_offline_commands_print_their_answer_only(tmp_path):
    cfg = master_yaml(tmp_path)
    MasterStore(tmp_path / "state" / "master.db").close()
    for command, answer in ((["pause"], "paused (applied to the stopped crawl)"),
                            (["resume"], "resumed (applied to the stopped crawl)"),
                            (["retry"], "0 failed URLs back in the queue (applied to the stopped crawl)")):
        r = run(["crawler.master", *command, "--config", str(cfg)], tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == answer and r.stderr == "", r
    # Asked for, the master's own lines are there.
    r = run(["crawler.master", "--log-level", "info", "pause", "--config", str(cfg)], tmp_path)
    assert r.returncode == 0 and "operator: crawl paused" in r.stderr, r


def test_a_config_key_typo_gets_a_did_you_mean(tmp_path):
    cfg = master_yaml(tmp_path, crawl={"max_page": 5})
    one_line(run(["crawler.master", "--config", str(cfg)], tmp_path),
             "crawler-master: config error: crawl.max_page: unknown key (did you mean 'max_pages'?")
    (tmp_path / "worker.yaml").write_text("concurency: 4\n")
    one_line(run(["crawler.worker", "--config", str(tmp_path / "worker.yaml")], tmp_path),
             "concurency: unknown key (did you mean 'concurrency'?")


def test_paths_are_printed_resolved(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    cfg = master_yaml(tmp_path, data_dir="../state")
    cfg = cfg.rename(etc / "master.yaml")
    MasterStore(tmp_path / "state" / "master.db").close()
    r = run(["crawler.master", "export", "--failed", "--config", "etc/master.yaml"], tmp_path)
    assert r.returncode == 0, r.stderr
    # An unusable path is named as it is, not as etc/../state.
    (tmp_path / "state" / "master.db").unlink()
    r = run(["crawler.master", "status", "--config", "etc/master.yaml"], tmp_path)
    assert r.returncode == 1 and f"no crawl state at {tmp_path / 'state' / 'master.db'} " in r.stderr, r.stderr
    assert ".." not in r.stderr


def test_the_site_generators_run_by_themselves_with_help(tmp_path):
    root = Path(__file__).resolve().parent.parent
    for script in ("sitegen.py", "sitegen_named.py"):
        r = subprocess.run([sys.executable, str(root / "scripts" / script), "--help"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=60, check=False)
        assert r.returncode == 0 and "--songs SONGS" in r.stdout and "song pages to generate" in r.stdout, r
    r = subprocess.run([sys.executable, str(root / "scripts" / "sitegen_named.py"), str(tmp_path / "site"),
                        "--songs", "6", "--origin", "http://127.0.0.1:8080"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60, check=False)
    assert r.returncode == 0 and "6 songs" in r.stdout, r
    assert "Sitemap: http://127.0.0.1:8080/sitemap-index.xml" in (tmp_path / "site" / "robots.txt").read_text()
