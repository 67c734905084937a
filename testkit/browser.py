"""A headless Chromium for tests and benchmarks that drive one themselves (the status page test): the worker's
own launcher (crawler/resolvers/chromium.py, the switches that keep the browser quiet, its sandbox and its user,
its process-tree kill), with the one switch more that a test's browser needs: it resolves no name, so it connects
nowhere but loopback."""

from __future__ import annotations

import getpass
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from crawler.resolvers.chromium import DEFAULT_USER, LOOPBACK_ONLY_ARGS, BrowserUser, ChromiumProcess, find_executable

# What a test's browser is started with, beside the launcher's own switches.
TEST_BROWSER_ARGS = list(LOOPBACK_ONLY_ARGS)
# Who it runs as: the dedicated user scripts/setup.sh creates when the tests run as root (as the worker would),
# else the test's own unprivileged user.
TEST_BROWSER_USER = DEFAULT_USER if os.geteuid() == 0 else getpass.getuser()


@asynccontextmanager
async def chromium(playwright: Any, timeout: float = 60) -> AsyncIterator[Any]:
    """Start Chromium with a fresh profile and yield the Playwright Browser connected to it; kill it (and its
    helpers and profile) after."""
    browser = await ChromiumProcess.start(playwright, find_executable(None), TEST_BROWSER_ARGS,
                                          user=BrowserUser.lookup(TEST_BROWSER_USER), timeout=timeout)
    try:
        yield browser.browser
    finally:
        await browser.close()
