"""The master's connections are tasks of its TaskGroup: a stop ends every one of them, a handshake in progress too."""

import asyncio

from crawler.master.config import MasterConfig
from crawler.master.server import Master
from scripts.cluster import write_secret


async def test_a_stop_closes_a_connection_in_the_middle_of_its_handshake(tmp_path):
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["w1"],
           "seeds": ["http://127.0.0.1:9/"], "secret_file": str(write_secret(tmp_path / "s")),
           "exit_when_done": False, "politeness": {"obey_robots": False}}
    master = Master(MasterConfig.from_mapping(raw, tmp_path))
    listening = asyncio.Event()
    serving = asyncio.create_task(master.serve(lambda _port: listening.set()))
    await asyncio.wait_for(listening.wait(), 30)
    assert master.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
    try:
        # A peer that connects and says nothing: the master waits up to its handshake limit (10 s) for a Hello.
        for _ in range(500):
            if master._connections:
                break
            await asyncio.sleep(0.01)
        assert master._connections, "the connection was not taken into the master's TaskGroup"
        master.stop()
        await asyncio.wait_for(serving, 10)
        # Closed by the stop, not left to the handshake limit or to the process's exit.
        assert await asyncio.wait_for(reader.read(), 3) == b""
        assert not master._connections
    finally:
        writer.close()
