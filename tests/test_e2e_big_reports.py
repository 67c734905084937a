"""Link-heavy pages: a burst of results whose links would not fit in one frame still all reach the master."""

import pytest
from aiohttp import web

from testkit import cluster

pytestmark = pytest.mark.timeout(120)

PAGES = 40
LINKS = 2500


def page(i: int) -> str:
    # 2,500 distinct links of about 120 characters each: about 300 KB of links a page, 12 MB for the burst
    filler = "x" * 80
    links = "".join(f'<a href="/p{i}/{j}/{filler}">.</a>' for j in range(LINKS))
    return f"<html><body>{links}</body></html>"


async def test_a_burst_of_link_heavy_results_is_split_across_frames(tmp_path):
    async def home(request):
        return web.Response(text="".join(f'<a href="/p{i}">p</a>' for i in range(PAGES)), content_type="text/html")

    async def heavy(request):
        return web.Response(text=page(int(request.match_info["i"])), content_type="text/html")

    app = web.Application()
    app.router.add_get("/", home)
    app.router.add_get(r"/p{i:\d+}", heavy)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        # The heavy pages' links are reported and counted, then refused by a deny pattern, never fetched.
        config = cluster.master_config(tmp_path, [base + "/"], ["w1"], crawl={"deny_patterns": ["x{80}"]},
                                       max_frame=1024 * 1024)
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path,
                                            extra=["--concurrency", "64"])
        assert await master.wait(90) == 0, master.log()[-2000:]
        assert await worker.wait(30) == 0, worker.log()[-2000:]
    finally:
        await runner.cleanup()
    summary = master.stdout.decode()
    assert f"links reported  {PAGES + PAGES * LINKS} " in summary, summary
    assert "broke the protocol" not in master.log()
    assert f"denied {PAGES * LINKS}" in summary, summary
