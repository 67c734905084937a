"""systemd's readiness and watchdog notifications (sd_notify), without a dependency: one datagram per message.

With `Type=notify` systemd starts the units that depend on a daemon only once it says READY=1, and with
`WatchdogSec=` it restarts a daemon whose loop stops saying WATCHDOG=1. Outside systemd ($NOTIFY_SOCKET unset)
every call does nothing.
"""

from __future__ import annotations

import os
import socket
import time

_last_watchdog = 0.0


def notify(message: str) -> bool:
    """Send one notification; False when not run by systemd or the socket is gone (never raises)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):   # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


def ready(status: str = "") -> None:
    notify("READY=1" + (f"\nSTATUS={status}" if status else ""))


def stopping() -> None:
    notify("STOPPING=1")


def watchdog() -> None:
    """Called from a daemon's loop: at most once a second, whatever the loop's rate. systemd wants a ping at least
    once per WatchdogSec (it tells us the period in $WATCHDOG_USEC); a live loop turns far faster than that."""
    global _last_watchdog
    now = time.monotonic()
    if now - _last_watchdog >= 1.0 and os.environ.get("WATCHDOG_USEC"):
        _last_watchdog = now
        notify("WATCHDOG=1")
