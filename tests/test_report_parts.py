"""A worker's report is recorded a part at a time, the master's event loop served between the parts: a part holds
at most REPORT_PART results and stops taking results once it holds PART_LINKS links, and no page is split."""

from crawler import protocol as p
from crawler.master.server import PART_LINKS, REPORT_PART, report_parts


def result(i: int, links: int) -> p.Result:
    return p.Result(i, f"http://s.test/{i}", p.DONE, 200, links=tuple(f"http://s.test/{i}/{j}" for j in range(links)))


def test_parts_are_bounded_by_results_and_by_links_and_keep_every_result_in_order():
    cases = [
        [result(i, 1) for i in range(40)],                               # light pages: REPORT_PART at a time
        [result(i, 900) for i in range(10)],                             # two heavy pages a part
        [result(0, 1), result(1, PART_LINKS + 500), result(2, 3)],       # a page past the bound is alone
        [result(0, PART_LINKS)],
        [],
    ]
    for results in cases:
        parts = list(report_parts(tuple(results)))
        assert [r for part in parts for r in part] == results
        for part in parts:
            assert 1 <= len(part) <= REPORT_PART
            assert len(part) == 1 or sum(len(r.links) for r in part) <= PART_LINKS
    assert [len(x) for x in report_parts(tuple(cases[0]))] == [16, 16, 8]
    assert [len(x) for x in report_parts(tuple(cases[1]))] == [2, 2, 2, 2, 2]
    assert [len(x) for x in report_parts(tuple(cases[2]))] == [1, 1, 1]
