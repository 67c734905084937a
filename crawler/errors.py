"""The config error both daemons and the modules under them raise: one line naming the key and the problem."""

from __future__ import annotations


class ConfigError(Exception):
    """A config problem; str() is one line: 'key.path: what is wrong'."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem
