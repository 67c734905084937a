"""The worker's download ledger on its own: its table walked row by row, with times passed in."""

from crawler import items as it
from crawler import protocol as p
from crawler.worker.ledger import DownloadLedger, Outgoing

PAGE = "http://site.example/song/1"
MP3 = "http://cdn.example.org/1.mp3"
SHA = "ab" * 32


def item(url: str = MP3, page: str = PAGE, **kw: object) -> it.AudioItem:
    return it.AudioItem(url=url, page=page, resolver="generic").replace(**{"status": it.OK, **kw})


def stored(url: str = MP3) -> it.AudioItem:
    return item(url, sha256=SHA, size=10, path="audio/1.mp3")


def up(pending_max: int = 4) -> DownloadLedger:
    ledger = DownloadLedger(pending_max, ask_delay=0.005)
    assert ledger.connect(0.0) is None
    return ledger


def test_asks_wait_ask_delay_to_share_a_flush_and_an_end_goes_at_once():
    ledger = up()
    t1, at = ledger.ask(MP3, 1.0)
    assert at == 1.005
    t2, at = ledger.ask(MP3 + "?2", 1.001)
    assert (t1, t2, at) == (1, 2, None)          # the flush arranged takes this ask too
    assert ledger.end(t1, stored(), 1.002) == 1.002   # sooner: the end frees its host's slot for the cluster
    assert ledger.end(t2, None, 1.002) is None
    out = ledger.flush()
    assert out == Outgoing(ends=(p.DownloadEnd(1, SHA, 10, "audio/1.mp3"), p.DownloadEnd(2)),
                           asks=((1, MP3), (2, MP3 + "?2")))
    assert ledger.flush() == Outgoing()
    _, at = ledger.ask(MP3, 2.0)
    assert at == 2.005                            # after a flush the next one is arranged afresh


def test_a_failed_download_ends_without_its_file():
    ledger = up()
    ledger.end(7, item(status=it.FAILED, sha256=SHA), 0.0)
    assert ledger.flush().ends == (p.DownloadEnd(7),)


def test_a_live_recording_ends_without_its_file_so_no_other_node_takes_it_for_a_copy():
    ledger = up()
    ledger.end(8, stored().replace(extra={"live": True, "format": "hls"}), 0.0)
    assert ledger.flush().ends == (p.DownloadEnd(8),)


def test_without_a_master_nothing_is_sent_and_nothing_is_arranged():
    ledger = DownloadLedger(4)
    assert ledger.end(3, stored(), 0.0) is None
    assert ledger.end(None, stored(), 0.0) is None
    assert ledger.flush() == Outgoing()
    ledger = up()
    ledger.ask(MP3, 0.0)
    ledger.disconnect()
    assert ledger.end(1, stored(), 0.0) is None
    assert ledger.flush() == Outgoing()
    # Asks and ends of the session that is gone are not sent in the next.
    ledger.connect(1.0)
    assert ledger.flush() == Outgoing()


def test_a_job_starts_once_per_download_and_its_item_is_reported_pending():
    ledger = up(pending_max=2)
    reported, start = ledger.start(item())
    assert reported.status == it.PENDING and start
    assert ledger.start(item()) == (reported, False)     # the same download, found again: one job
    assert not ledger.full
    assert ledger.start(item(MP3 + "?2"))[1]
    assert ledger.full and ledger.pending() == 2


def test_an_outcome_waits_for_the_report_that_names_its_download_pending():
    ledger = up()
    ledger.start(item())
    done, at = ledger.ended((PAGE, MP3), stored(), 1.0)
    assert done == stored() and at is None               # held: the master would find nothing pending
    assert ledger.flush().outcomes == ()
    assert ledger.reported({(PAGE, MP3)}, 2.0) == 2.0
    assert ledger.flush().outcomes == ((MP3, stored()),)
    # A download whose page was reported already goes at once.
    ledger.start(item(MP3 + "?2"))
    ledger.reported({(PAGE, MP3 + "?2")}, 3.0)
    assert ledger.ended((PAGE, MP3 + "?2"), stored(MP3 + "?2"), 4.0)[1] == 4.0
    assert ledger.flush().outcomes == ((MP3 + "?2", stored(MP3 + "?2")),)


def test_an_outcome_is_only_ok_or_failed_and_within_the_wires_limits():
    ledger = up()
    ledger.start(item())
    done, _ = ledger.ended((PAGE, MP3), item(status=it.UNAVAILABLE), 0.0)
    assert done.status == it.FAILED and done.reason == f"download ended {it.UNAVAILABLE}"
    ledger.start(item(MP3 + "?2"))
    huge = stored(MP3 + "?2").replace(lyrics="x" * 10_000_000)
    done, _ = ledger.ended((PAGE, MP3 + "?2"), huge, 0.0)
    assert done.lyrics is None and done.sha256 == SHA


def test_a_page_report_carries_the_outcomes_that_ended_while_it_waited():
    ledger = up()
    ledger.start(item())
    ledger.start(item(MP3 + "?2"))
    ledger.ended((PAGE, MP3), stored(), 0.0)
    keys = {(PAGE, MP3), (PAGE, MP3 + "?2")}
    assert ledger.outcomes_of(keys) == {(PAGE, MP3): stored()}    # the other still runs
    # Taken by that report: not sent apart once it is reported.
    assert ledger.reported(keys, 1.0) is None
    assert ledger.flush().outcomes == ()
    # Another visit of the same page, whose first report took the outcome: the settled one stands.
    assert ledger.outcomes_of({(PAGE, MP3)}) == {(PAGE, MP3): stored()}


def test_a_download_handed_over_runs_once_and_one_that_ended_lately_is_sent_again():
    ledger = up()
    assert ledger.take(item(), 0.0) == (True, None)
    assert ledger.take(item(), 0.0) == (False, None)     # running already
    ledger.ended((PAGE, MP3), stored(), 1.0)
    ledger.flush()
    assert ledger.take(item(), 2.0) == (False, 2.0)      # ended: its outcome goes again, nothing is fetched
    assert ledger.flush().outcomes == ((MP3, stored()),)


def test_settled_outcomes_are_bounded_oldest_forgotten_first():
    ledger = DownloadLedger(8, kept=2)
    ledger.connect(0.0)
    for n in range(3):
        ledger.take(item(f"{MP3}?{n}"), 0.0)
        ledger.ended((PAGE, f"{MP3}?{n}"), stored(f"{MP3}?{n}"), 0.0)
    ledger.flush()
    assert ledger.take(item(f"{MP3}?0"), 1.0) == (True, None)   # forgotten: fetched again
    assert ledger.take(item(f"{MP3}?2"), 1.0)[0] is False


def test_outcomes_outlive_the_session_and_go_first_in_the_next():
    ledger = up()
    ledger.start(item())
    ledger.start(item(MP3 + "?2"))
    ledger.ended((PAGE, MP3), stored(), 0.0)              # its report never went: held
    ledger.disconnect()                                  # the report is lost, the outcome is not
    ledger.ended((PAGE, MP3 + "?2"), stored(MP3 + "?2"), 1.0)
    assert ledger.flush() == Outgoing()
    assert ledger.connect(2.0) == 2.0
    out = ledger.flush()
    assert out.outcomes == ((MP3, stored()), (MP3 + "?2", stored(MP3 + "?2")))
    ledger.unsent(out.outcomes)                          # the connection closed under the flush
    ledger.take(item(MP3 + "?3"), 3.0)
    ledger.ended((PAGE, MP3 + "?3"), stored(MP3 + "?3"), 3.0)
    assert [u for u, _ in ledger.flush().outcomes] == [MP3, MP3 + "?2", MP3 + "?3"]


def test_a_job_stopped_without_an_outcome_leaves_no_download_pending():
    ledger = up(pending_max=1)
    ledger.start(item())
    assert ledger.full
    ledger.dropped((PAGE, MP3))
    assert not ledger.full
