"""The master's connections are tasks of its TaskGroup: a stop ends every one of them, a handshake in progress too.

No wall-clock budget decides this test (pytest's own timeout is the only bound): the master listens on no fixed
port (its status page is off: a fixed port taken by a master running beside the suite failed its start, which the
test only saw as a timeout), its filter is small (the default one's 36 MB snapshot, written and synced at start
and stop, is slow on a busy disk), and the handshake limit is raised far past the test's run, so the stop is the
only thing that can close the connection.
"""

import asyncio

from crawler.master import server as master_server
from crawler.master.config import MasterConfig
from crawler.master.server import Master
from testkit.cluster import write_secret


async def test_a_stop_closes_a_connection_in_the_middle_of_its_handshake(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(master_server, "HANDSHAKE_TIMEOUT", 24 * 3600.0)
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["w1"],
           "seeds": ["http://127.0.0.1:9/"], "secret_file": str(write_secret(tmp_path / "s")),
           "exit_when_done": False, "politeness": {"obey_robots": False}, "web": {"listen": "off"},
           "dedup": {"expected_urls": 1000}}
    master = Master(MasterConfig.from_mapping(raw, tmp_path))
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    started = asyncio.create_task(listening.wait())
    await asyncio.wait({serving, started}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():   # it could not start: its own error, not a wait that runs out
        started.cancel()
        serving.result()
        raise AssertionError("the master ended before it listened")
    assert master.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
    try:
        # A peer that connects and says nothing. Its connection becomes a task of the master's TaskGroup once
        # the group runs (one accepted before that waits for it).
        while not master._connections:
            assert not serving.done(), "the master ended while a connection was being taken in"
            await asyncio.sleep(0.01)
        master.stop()
        await serving
        # Closed by the stop: the handshake limit is a day away, and the process goes on.
        assert await reader.read() == b""
        assert not master._connections
        assert "no handshake within" not in caplog.text
    finally:
        writer.close()
