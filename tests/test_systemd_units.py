"""The shipped systemd units: valid for systemd, hardened, and the daemons speak sd_notify as Type=notify expects."""

import asyncio
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import cluster

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "scripts" / "systemd"
INSTALLED_BIN = "/opt/audio-crawler/.venv/bin/"
# The worker's is higher by what the browser resolver's confinement costs in systemd's scoring: it switches to
# the browser's own user (CAP_SETUID CAP_SETGID, other users mapped and visible in /proc), and Chromium's sandbox
# makes user, pid and network namespaces and chroots (0.5 in all). Without them the browser would run as the
# worker, or without its sandbox.
MAX_EXPOSURE = {"crawler-master.service": 2.0, "crawler-worker.service": 2.5}


def analyze(*args: str) -> subprocess.CompletedProcess:
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: scripts/setup.sh installs systemd"
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120, check=False)


def as_installed_here(unit: str, tmp: Path) -> Path:
    """The unit with its ExecStart pointing at this checkout's entry points instead of /opt/audio-crawler (verify
    checks that the program exists); nothing else changes."""
    text = (UNITS / unit).read_text()
    assert INSTALLED_BIN in text
    out = tmp / unit
    out.write_text(text.replace(INSTALLED_BIN, str(Path(sys.executable).parent) + "/"))
    return out


@pytest.mark.parametrize("unit", ["crawler-master.service", "crawler-worker.service"])
def test_unit_verifies_and_its_exposure_is_at_most_2(unit, tmp_path):
    path = as_installed_here(unit, tmp_path)
    r = analyze("verify", str(path))
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stderr + r.stdout
    r = analyze("security", "--offline=yes", str(path))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE[unit], r.stdout


def test_the_worker_unit_lets_the_browser_run_as_its_own_user_in_its_sandbox():
    settings = [line for line in (UNITS / "crawler-worker.service").read_text().splitlines()
                if line and not line.startswith("#")]
    assert "CapabilityBoundingSet=CAP_SETUID CAP_SETGID" in settings          # to switch to crawler-browser
    assert "AmbientCapabilities=CAP_SETUID CAP_SETGID" in settings
    assert "RestrictNamespaces=user pid net" in settings                       # Chromium's sandbox, no more
    assert "SystemCallFilter=@setuid chroot capset" in settings
    assert not any(s.startswith("PrivateUsers=yes") or s == "ProtectProc=invisible" for s in settings)


@pytest.mark.parametrize("unit", ["crawler-master.service", "crawler-worker.service"])
def test_unit_does_not_restart_on_a_mistake_and_takes_settings_from_files(unit):
    text = (UNITS / unit).read_text()
    assert "RestartPreventExitStatus=2" in text and "Type=notify" in text
    execstart = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert "--" not in execstart, "settings belong in the config or the environment file, not in ExecStart"
    assert "EnvironmentFile=-/etc/audio-crawler/" in text


def _notify_socket(tmp: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp / "notify.sock"))
    sock.setblocking(False)
    return sock


async def _wait_for(sock: socket.socket, word: bytes, timeout: float) -> bytes:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        while True:
            data = await loop.sock_recv(sock, 4096)
            if word in data:
                return data


async def test_master_and_worker_tell_systemd_they_are_ready_and_alive(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    sock = _notify_socket(tmp_path)
    try:
        config = cluster.master_config(tmp_path, ["http://127.0.0.1:9/"], ["w1"], exit_when_done=False)
        master = await cluster.start_master(config, tmp_path)
        try:
            ready = await _wait_for(sock, b"READY=1", 60)
            assert b"STATUS=listening on 127.0.0.1:" in ready
            await _wait_for(sock, b"WATCHDOG=1", 30)
            worker = await cluster.start_worker("127.0.0.1:9", "w1", tmp_path)   # nobody there: it still runs
            try:
                await _wait_for(sock, b"READY=1", 60)
                assert worker.proc.returncode is None
            finally:
                await worker.stop()
        finally:
            await master.stop()
    finally:
        sock.close()
    assert master.proc.returncode == 0
