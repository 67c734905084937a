"""A config dataclass is its YAML schema: the key table derived from its fields accepts, refuses and fills in
exactly what the fields say, and builds the dataclass from what it read."""

import socket
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import yaml

from crawler.config import ConfigError, Key, from_values, keys_of, parse_keys, positive, setting
from crawler.master.config import SPEC as MASTER_SPEC
from crawler.master.config import Politeness
from crawler.politeness import PolitenessConfig
from crawler.worker.config import SPEC as WORKER_SPEC
from crawler.worker.config import WorkerConfig
from testkit.cluster import write_secret


def _shout(v: str | None, key: str) -> str:
    if v == "bad":
        raise ConfigError(key, "is bad")
    return (v or "nothing").upper()


@dataclass(frozen=True)
class Inner:
    size: int = setting("int", 3, positive)
    tuning: float = 0.5                         # no setting: not a YAML key

    def __post_init__(self) -> None:
        if self.size == 13:
            raise ValueError("size 13 is unlucky")


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str = setting("str")                  # required
    word: str = setting("str", None, yaml="word_file", convert=_shout)
    inner: Inner


def load(raw: dict) -> Outer:
    return from_values(Outer, parse_keys(raw, keys_of(Outer), Path("/")))


def test_the_key_table_is_the_fields_with_settings_and_sections_in_field_order():
    spec = keys_of(Outer)
    assert list(spec) == ["name", "word_file", "inner"]
    assert spec["name"] == Key("str")
    assert spec["word_file"] == Key("str", None)
    assert spec["inner"].kind == "section" and spec["inner"].section == {"size": Key("int", 3, positive)}


def test_defaults_are_filled_in_and_shared_with_the_dataclass():
    cfg = load({"name": "a"})
    assert cfg == Outer(name="a", word="NOTHING", inner=Inner(size=3, tuning=0.5))
    assert Inner().size == keys_of(Outer)["inner"].section["size"].default == 3


def test_values_are_parsed_checked_and_converted_under_their_yaml_name():
    assert load({"name": "a", "word_file": "hi", "inner": {"size": 7}}) == Outer(name="a", word="HI",
                                                                                  inner=Inner(size=7))
    with pytest.raises(ConfigError, match="^word_file: is bad$"):
        load({"name": "a", "word_file": "bad"})


@pytest.mark.parametrize("raw, message", [
    ({}, "name: required key is missing"),
    ({"name": "a", "word": "x"}, "word: unknown key (did you mean 'word_file'? known keys: inner, name, word_file)"),
    ({"name": "a", "inner": {"tuning": 1.0}}, "inner.tuning: unknown key (known keys: size)"),
    ({"name": "a", "inner": {"size": 0}}, "inner.size: must be greater than 0"),
    ({"name": "a", "inner": {"size": "3"}}, "inner.size: expected an integer, got str '3'"),
    ({"name": "a", "inner": {"size": 13}}, "inner: size 13 is unlucky"),   # the dataclass's own check
])
def test_bad_input_is_a_one_line_error_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as e:
        load(raw)
    assert str(e.value) == message


def test_a_field_with_a_conversion_has_no_dataclass_default():
    with pytest.raises(TypeError):
        Outer(name="a", inner=Inner())   # type: ignore[call-arg]


def test_the_politeness_keys_are_the_settings_of_the_gates_config_and_the_masters_own():
    section = MASTER_SPEC["politeness"].section
    assert section is not None
    own = {"robots_timeout", "audio_max_per_host", "audio_min_delay"}
    assert set(section) == set(keys_of(PolitenessConfig)) | own
    assert set(keys_of(Politeness)) == set(section)
    internal = {f.name for f in fields(PolitenessConfig)} - set(section)
    assert internal == {"robots_ttl", "robots_retry_after", "robots_fetch_timeout", "host_idle_ttl",
                        "robots_max_hosts", "robots_max_rules"}
    for name, key in section.items():     # each YAML default is the dataclass's own
        assert getattr(Politeness(), name) == key.default, name


ARCHIVE_KEYS = ("enabled", "file_bytes", "file_seconds", "keep_bytes", "keep_seconds", "audio_payload")


def _dotted(spec, prefix=""):
    for name, key in spec.items():
        yield from _dotted(key.section, f"{prefix}{name}.") if key.section is not None else [prefix + name]


def test_the_yaml_keys_users_write_are_unchanged():
    # The keys are a contract with every config file in use: a field that stops being a setting must not
    # silently drop its key.
    assert sorted(_dotted(MASTER_SPEC)) == sorted([
        "listen", "data_dir", "store", "secret_file", "nodes", "seeds", "exit_when_done", "max_frame",
        "log_interval", "proxies", "sites",
        *(f"crawl.{k}" for k in ("max_depth", "max_pages", "max_bytes", "max_duration", "max_url_length",
                                 "max_query_params",
                                 "max_separator_ratio", "allowed_hosts", "allowed_networks", "allow_patterns",
                                 "deny_patterns", "sort_query", "drop_params", "keep_fragment",
                                 "approved_fragment_rules", "refresh_interval",
                                 "refresh_min", "refresh_max", "refresh_hub_interval", "max_attempts")),
        *(f"scheduling.{k}" for k in ("key", "batch_size", "lease_timeout", "heartbeat_interval",
                                      "heartbeat_timeout", "fault_timeout")),
        *(f"politeness.{k}" for k in ("max_per_host", "min_delay", "obey_robots", "crawl_delay_cap", "user_agent",
                                      "robots_timeout", "adaptive", "max_delay", "target_concurrency",
                                      "backoff_base", "backoff_max", "retry_after_cap", "audio_max_per_host",
                                      "audio_min_delay")),
        *(f"dedup.{k}" for k in ("expected_urls", "fp_rate", "bits_per_url", "hashes", "whitelist",
                                 "snapshot_interval")),
        "web.listen", "web.token_file", "web.allowed_hosts", "alerts.webhook", "alerts.secret_file",
        *(f"archive.{k}" for k in ARCHIVE_KEYS),
    ])
    assert sorted(_dotted(WORKER_SPEC)) == sorted([
        "master", "id", "data_dir", "secret_file", "concurrency", "downloads", "downloads_per_host", "pending_downloads",
        "report_wait", "max_tasks", "user_agent", "max_page_bytes", "max_audio_bytes", "connect_timeout", "read_timeout", "fetch_timeout",
        "download_timeout", "download_min_rate", "revalidate_after", "live_record_seconds", "max_page_depth", "max_page_tags",
        "max_redirects", "dns_ttl", "link_cache", "max_links_per_page", "store_pages", "page_format",
        "min_free_bytes", "download_audio", "reconnect_max_delay", "evidence_max_bytes", "resolvers",
        "metrics_listen", "log_interval", "proxies",
        *(f"identify.{k}" for k in ("enabled", "processes", "max_backlog", "wait")),
        *(f"archive.{k}" for k in ARCHIVE_KEYS),
    ])


def test_worker_values_derived_from_their_keys(tmp_path, monkeypatch):
    secret = write_secret(tmp_path / "s")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    (tmp_path / "etc").mkdir()
    conf = tmp_path / "etc" / "w.yaml"
    conf.write_text(yaml.safe_dump({"master": "m.example:7700", "secret_file": "s", "downloads": 1,
                                    "resolvers": {"generic": None}}))
    w = WorkerConfig.build(conf, {"secret_file": "s", "id": None})   # the flag's path is the cwd's
    assert (w.master, w.id, w.data_dir) == (("m.example", 7700), socket.gethostname(), tmp_path / "state")
    assert w.secret == secret.read_bytes().strip() and w.resolvers == {"generic": {}}
    assert w.max_tasks == 2 * 64 + 2 * 1                                # from concurrency and downloads
    assert WorkerConfig.build(conf, {"secret_file": "s", "max_tasks": 5}).max_tasks == 5
    with pytest.raises(ConfigError, match="^secret_file: cannot read .*etc/s"):   # the file's path is its folder's
        WorkerConfig.build(conf, {})
    with pytest.raises(ConfigError, match="^resolvers.generic: expected a mapping"):
        WorkerConfig.build(conf, {"secret_file": "s", "resolvers": {"generic": 1}})
    with pytest.raises(ConfigError, match="^master: expected host:port, got 'nowhere'"):
        WorkerConfig.build(conf, {"secret_file": "s", "master": "nowhere"})


def test_the_archive_section_and_the_old_warc_file_bytes_key(tmp_path, monkeypatch):
    write_secret(tmp_path / "s")
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "w.yaml"

    def build(raw):
        conf.write_text(yaml.safe_dump({"master": "m.example:7700", "secret_file": "s", **raw}))
        return WorkerConfig.build(conf, {}).archive

    a = build({})
    assert (a.enabled, a.file_bytes, a.file_seconds, a.keep_bytes, a.keep_seconds, a.audio_payload) == (
        True, 1024 ** 3, 86_400.0, 0, 0.0, False)
    assert build({"archive": {"keep_bytes": 10, "audio_payload": True}}).keep_bytes == 10
    # The key the WARC page store had is the archive's file size now; the section's own key wins.
    assert build({"warc_file_bytes": 4096}).file_bytes == 4096
    assert build({"warc_file_bytes": 4096, "archive": {"file_bytes": 8192}}).file_bytes == 8192
    for raw, message in [({"archive": {"file_bytes": 0}}, "^archive.file_bytes: must be greater than 0$"),
                         ({"archive": {"keep_seconds": -1}}, "^archive.keep_seconds: "),
                         ({"archive": {"size": 1}}, "^archive.size: unknown key"),
                         ({"warc_file_bytes": "big"}, "^archive.file_bytes: expected an integer")]:
        with pytest.raises(ConfigError, match=message):
            build(raw)
