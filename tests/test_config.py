import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from crawler.config import ConfigError
from crawler.master.config import MasterConfig
from crawler.worker.config import WorkerConfig
from testkit.cluster import write_secret


def base(tmp: Path) -> dict:
    return {"listen": "127.0.0.1:7700", "data_dir": "data", "secret_file": str(write_secret(tmp / "secret")),
            "nodes": ["a", "b"], "seeds": ["http://127.0.0.1:8000/"]}


def test_minimal_config_gets_defaults_and_seed_hosts_as_scope(tmp_path):
    cfg = MasterConfig.from_mapping(base(tmp_path), tmp_path)
    assert cfg.listen == ("127.0.0.1", 7700)
    assert cfg.data_dir == tmp_path / "data"
    assert cfg.crawl.max_depth == 5 and cfg.crawl.max_url_length == 256
    assert cfg.crawl.allowed_hosts == ("127.0.0.1:8000",)   # the seed's port is part of the scope
    assert cfg.secret == (tmp_path / "secret").read_bytes().strip() and len(cfg.secret) >= 32


def test_example_configs_in_the_repo_are_valid(tmp_path):
    root = Path(__file__).resolve().parent.parent
    raw = yaml.safe_load((root / "configs" / "master.yaml").read_text())
    raw["secret_file"] = str(write_secret(tmp_path / "s"))
    MasterConfig.from_mapping(raw, tmp_path)
    wraw = yaml.safe_load((root / "configs" / "worker.yaml").read_text())
    wpath = tmp_path / "worker.yaml"
    wpath.write_text(yaml.safe_dump(wraw))
    w = WorkerConfig.build(wpath, {"master": "h:1", "id": "a", "data_dir": str(tmp_path),
                                   "secret_file": str(tmp_path / "s")})
    assert w.max_tasks == 2 * 64 + 2 * 32 and w.downloads_per_host == 4


@pytest.mark.parametrize("change, key, words", [
    ({"seeds": None}, "seeds", "required"),
    ({"nodes": "a"}, "nodes", "list of strings"),
    ({"crawl": {"max_depth": "five"}}, "crawl.max_depth", "integer"),
    ({"crawl": {"max_dpeth": 3}}, "crawl.max_dpeth", "unknown key"),
    ({"bogus": 1}, "bogus", "unknown key"),
    ({"listen": "nowhere"}, "listen", "host:port"),
    ({"seeds": ["ftp://x/"]}, "seeds", "not an http"),
    ({"nodes": ["a", "a"]}, "nodes", "unique"),
    ({"dedup": {"fp_rate": 2}}, "dedup.fp_rate", "between 0 and 1"),
    ({"scheduling": {"heartbeat_timeout": 1, "heartbeat_interval": 5}}, "scheduling.heartbeat_timeout", "longer"),
    ({"politeness": {"obey_robots": "yes"}}, "politeness.obey_robots", "true or false"),
    ({"crawl": {"allowed_networks": ["10.0.0.0/33"]}}, "crawl.allowed_networks", "not an IP network"),
    ({"crawl": {"allowed_networks": ["intranet.example"]}}, "crawl.allowed_networks", "not an IP network"),
    ({"politeness": {"robots_timeout": 0}}, "politeness.robots_timeout", "greater than 0"),
    ({"politeness": {"min_delay": 2, "max_delay": 1}}, "politeness.max_delay", "below politeness.min_delay"),
    ({"politeness": {"backoff_base": 10, "backoff_max": 1}}, "politeness.backoff_max", "below"),
    ({"politeness": {"target_concurrency": 0}}, "politeness.target_concurrency", "greater than 0"),
    ({"politeness": {"adaptive": 1}}, "politeness.adaptive", "true or false"),
])
def test_bad_values_name_the_key(tmp_path, change, key, words):
    raw = base(tmp_path)
    for k, v in change.items():
        if v is None:
            raw.pop(k)
        else:
            raw[k] = v
    with pytest.raises(ConfigError) as e:
        MasterConfig.from_mapping(raw, tmp_path)
    assert e.value.key == key
    assert words in str(e.value)


def test_short_secret_refused(tmp_path):
    raw = base(tmp_path)
    raw["secret_file"] = str(write_secret(tmp_path / "short", "abc"))
    with pytest.raises(ConfigError, match="secret_file: .* use at least 16"):
        MasterConfig.from_mapping(raw, tmp_path)


@pytest.mark.parametrize("secret", [
    "a" * 64,                                   # one distinct byte
    "passwordpassword",                         # a word, twice
    "supersecretpassword",                      # words only
    "abcdefghijklmnopqrstuvwxyz0123456789",     # runs
    "0123456789abcdef",                         # a run, 16 distinct bytes
    "correct horse battery staple",             # a phrase of common words
])
def test_guessable_secret_refused(tmp_path, secret):
    raw = base(tmp_path)
    raw["secret_file"] = str(write_secret(tmp_path / "weak", secret))
    with pytest.raises(ConfigError, match=r"secret_file: .*weak holds a guessable secret.* /dev/urandom"):
        MasterConfig.from_mapping(raw, tmp_path)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o622])
def test_secret_readable_by_others_refused_with_the_fix(tmp_path, mode):
    raw = base(tmp_path)
    (tmp_path / "secret").chmod(mode)
    with pytest.raises(ConfigError) as e:
        MasterConfig.from_mapping(raw, tmp_path)
    assert str(e.value) == (f"secret_file: {tmp_path / 'secret'} is readable or writable by group or others; "
                            f"fix: chmod 600 {tmp_path / 'secret'}")


@pytest.mark.parametrize("daemon", ["master", "worker"])
def test_cli_refuses_open_or_weak_secret_one_line_exit_2(tmp_path, daemon):
    raw = base(tmp_path)
    cfg = tmp_path / "m.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    args = (["crawler.master", "--config", str(cfg)] if daemon == "master" else
            ["crawler.worker", "--master", "127.0.0.1:1", "--id", "a", "--data-dir", str(tmp_path / "w"),
             "--secret-file", str(tmp_path / "secret")])
    (tmp_path / "secret").chmod(0o644)
    r = _run(args, tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"chmod 600 {tmp_path / 'secret'}" in r.stderr and "Traceback" not in r.stderr
    write_secret(tmp_path / "secret", "aaaaaaaaaaaaaaaaaaaaaaaa")
    r = _run(args, tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "guessable secret" in r.stderr and "Traceback" not in r.stderr


def _run(args, cwd):
    return subprocess.run([sys.executable, "-m", *args], check=False, capture_output=True, text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("mutate, expected", [
    (lambda r: r.pop("nodes"), "nodes: required key is missing"),
    (lambda r: r.update(colour="blue"), "colour: unknown key"),
    (lambda r: r.update(exit_when_done="sometimes"), "exit_when_done: expected true or false"),
])
def test_master_cli_bad_config_one_line_exit_2(tmp_path, mutate, expected):
    raw = base(tmp_path)
    mutate(raw)
    cfg = tmp_path / "m.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    r = _run(["crawler.master", "--config", str(cfg)], tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert expected in lines[0] and "Traceback" not in r.stderr


def test_master_cli_unreadable_and_invalid_yaml(tmp_path):
    r = _run(["crawler.master", "--config", str(tmp_path / "missing.yaml")], tmp_path)
    assert r.returncode == 2 and "cannot read config" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [unclosed\n")
    r = _run(["crawler.master", "--config", str(bad)], tmp_path)
    assert r.returncode == 2 and "not valid YAML" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_worker_cli_missing_flag_and_bad_resolver(tmp_path):
    r = _run(["crawler.worker", "--id", "a", "--data-dir", str(tmp_path)], tmp_path)
    assert r.returncode == 2 and "master: required" in r.stderr and "Traceback" not in r.stderr
    r = _run(["crawler.worker", "--master", "127.0.0.1:1", "--id", "a", "--data-dir", str(tmp_path),
              "--secret-file", "nosuch"], tmp_path)
    assert r.returncode == 2 and f"secret_file: cannot read {tmp_path / 'nosuch'}" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    cfg = tmp_path / "w.yaml"
    cfg.write_text(yaml.safe_dump({"resolvers": {"nosuch": {}}, "concurrency": 4}))
    r = _run(["crawler.worker", "--master", "127.0.0.1:1", "--id", "a", "--data-dir", str(tmp_path),
              "--secret-file", str(write_secret(tmp_path / "s")), "--config", str(cfg)], tmp_path)
    assert r.returncode == 2 and "nosuch" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_second_master_on_the_same_state_and_a_taken_port_are_one_line_errors(tmp_path):
    import socket

    raw = base(tmp_path)
    raw["listen"] = "127.0.0.1:0"
    raw["web"] = {"listen": "127.0.0.1:0"}   # never a fixed port in tests
    raw["exit_when_done"] = False
    cfg = tmp_path / "m.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    first = subprocess.Popen([sys.executable, "-m", "crawler.master", "--config", str(cfg)], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        addr = tmp_path / "data" / "master.addr"
        deadline = time.monotonic() + 30
        while not addr.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert addr.exists()
        r = _run(["crawler.master", "--config", str(cfg)], tmp_path)
        assert r.returncode == 2 and "in use by another master" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        first.terminate()
        assert first.wait(30) == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        raw["listen"] = f"127.0.0.1:{taken.getsockname()[1]}"
        cfg.write_text(yaml.safe_dump(raw))
        r = _run(["crawler.master", "--config", str(cfg)], tmp_path)
    assert r.returncode == 2 and "address already in use" in r.stderr.lower()
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_web_listen_defaults_to_loopback_and_can_be_switched_off(tmp_path):
    cfg = MasterConfig.from_mapping(base(tmp_path), tmp_path)
    assert cfg.web.listen == ("127.0.0.1", 0) and cfg.web.token is None and cfg.log_interval == 30
    assert cfg.web.allowed_hosts == ()
    with pytest.raises(ConfigError, match="web.allowed_hosts: 'http://x.example' is not a host name"):
        MasterConfig.from_mapping({**base(tmp_path), "web": {"allowed_hosts": ["http://x.example"]}}, tmp_path)
    for off in (None, False, "off", "OFF"):
        assert MasterConfig.from_mapping({**base(tmp_path), "web": {"listen": off}}, tmp_path).web.listen is None
    assert yaml.safe_load("listen: off") == {"listen": False}     # YAML's own reading of a bare off
    with pytest.raises(ConfigError, match="web.listen: expected host:port"):
        MasterConfig.from_mapping({**base(tmp_path), "web": {"listen": "nowhere"}}, tmp_path)


def test_web_beyond_loopback_needs_a_token(tmp_path):
    public = {**base(tmp_path), "web": {"listen": "0.0.0.0:7780"}}
    with pytest.raises(ConfigError, match="web.listen: 0.0.0.0 is not a loopback address: set web.token_file"):
        MasterConfig.from_mapping(public, tmp_path)
    token = write_secret(tmp_path / "token")
    cfg = MasterConfig.from_mapping({**public, "web": {"listen": "0.0.0.0:7780", "token_file": str(token)}},
                                    tmp_path)
    assert cfg.web.token == token.read_text().strip()
    token.chmod(0o644)                            # a token file is held to the secret file's rules
    with pytest.raises(ConfigError, match=f"web.token_file: {token} is readable .* chmod 600"):
        MasterConfig.from_mapping({**public, "web": {"listen": "0.0.0.0:7780", "token_file": str(token)}}, tmp_path)
    assert MasterConfig.from_mapping({**base(tmp_path), "web": {"listen": "[::1]:0"}}, tmp_path).web.listen == \
        ("::1", 0)


def test_worker_metrics_listen_is_off_unless_asked(tmp_path):
    args = {"master": "h:1", "id": "a", "data_dir": str(tmp_path), "secret_file": str(write_secret(tmp_path / "s"))}
    assert WorkerConfig.build(None, args).metrics_listen is None
    assert WorkerConfig.build(None, {**args, "metrics_listen": "127.0.0.1:0"}).metrics_listen == ("127.0.0.1", 0)


def test_kugou_search_seeds_become_search_urls_and_bring_the_song_host_into_scope(tmp_path):
    raw = dict(base(tmp_path), seeds=[{"kugou-search": "周杰伦 晴天"}, "kugou-search: Adele",
                                      "http://127.0.0.1:8000/"])
    cfg = MasterConfig.from_mapping(raw, tmp_path)
    assert cfg.seeds[0] == ("https://songsearch.kugou.com/song_search_v2?"
                            "keyword=%E5%91%A8%E6%9D%B0%E4%BC%A6+%E6%99%B4%E5%A4%A9&page=1&pagesize=30")
    assert cfg.seeds[1].startswith("https://songsearch.kugou.com/song_search_v2?keyword=Adele&")
    assert cfg.crawl.allowed_hosts == ("songsearch.kugou.com", "127.0.0.1:8000", "www.kugou.com")


@pytest.mark.parametrize("entry, words", [({"kugou-search": ""}, "needs the words"),
                                          ({"kugou-search": "x", "other": 1}, "no other keys"),
                                          ("kugou-search:   ", "needs the words"),
                                          ({"kugou-search": ["a"]}, "needs the words")])
def test_bad_kugou_search_seeds_name_the_entry(tmp_path, entry, words):
    with pytest.raises(ConfigError, match=rf"^seeds\[1\]: .*{words}"):
        MasterConfig.from_mapping(dict(base(tmp_path), seeds=["http://a/", entry]), tmp_path)


def test_politeness_defaults_are_the_gates_own(tmp_path):
    from dataclasses import fields

    from crawler.politeness import PolitenessConfig
    from crawler.resolvers.kugou import KugouResolver

    cfg = MasterConfig.from_mapping(base(tmp_path), tmp_path)
    assert isinstance(cfg.politeness, PolitenessConfig)
    defaults = PolitenessConfig()
    for f in fields(PolitenessConfig):
        assert getattr(cfg.politeness, f.name) == getattr(defaults, f.name), f.name
    # The fragment rule a master keeps before any worker joins is the Kugou resolver's own.
    assert cfg.crawl.keep_fragment == KugouResolver({}).keep_fragment


def test_politeness_values_the_gate_refuses_are_one_line_config_errors(tmp_path):
    raw = base(tmp_path)
    raw["politeness"] = {"user_agent": "  "}
    with pytest.raises(ConfigError, match="^politeness: user_agent must not be empty"):
        MasterConfig.from_mapping(raw, tmp_path)
