"""The README documents every config key both daemons accept, named as users write it in their YAML."""

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from crawler.config import Key
from crawler.master.config import SPEC as MASTER_SPEC
from crawler.worker.config import SPEC as WORKER_SPEC

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def keys(spec: Mapping[str, Key], prefix: str = "") -> Iterator[str]:
    for name, key in spec.items():
        if key.section is not None:
            yield from keys(key.section, f"{prefix}{name}.")
        else:
            yield prefix + name


@pytest.mark.parametrize("daemon, spec", [("master", MASTER_SPEC), ("worker", WORKER_SPEC)])
def test_every_config_key_is_in_the_readme(daemon, spec):
    missing = [k for k in keys(spec) if f"`{k}`" not in README]
    assert not missing, f"{daemon} config keys the README does not name: {missing}"
