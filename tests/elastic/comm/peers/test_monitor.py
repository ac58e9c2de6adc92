"""The failure monitor on its own, over real socket pairs: what it reports (lost,
closing, aborted) and when (hang-ups at once or after the grace, silence after
peer_timeout), and that it keeps quiet about neighbours that closed on purpose."""

from __future__ import annotations

import queue
import socket
import threading
import time

import pytest

from elastic.comm import CommSettings, wire
from elastic.comm.peers.monitor import FailureMonitor, MonitorHooks
from elastic.errors import LossCause

LEFT, RIGHT = 3, 5
SETTINGS = CommSettings(peer_timeout=0.6, heartbeat_interval=0.1, close_grace=0.15)


class Harness:
    """A monitor watching two neighbours; the test holds the neighbours' ends."""

    def __init__(
        self, settings: CommSettings = SETTINGS, closing_ends: bool = False, silent: bool = False
    ):
        self.reports: queue.Queue = queue.Queue()
        self.socks: list[socket.socket] = []
        ours, self.peer = {}, {}
        for name in ("ctrl_left", "ctrl_right", "data_left", "data_right"):
            a, b = socket.socketpair()
            a.setblocking(False)
            ours[name], self.peer[name] = a, b
            self.socks += [a, b]
        self.closing_ends = closing_ends
        self.monitor = FailureMonitor(
            "test-monitor",
            [(ours["ctrl_left"], LEFT), (ours["ctrl_right"], RIGHT)],
            [(ours["data_left"], LEFT), (ours["data_right"], RIGHT)],
            settings,
            MonitorHooks(
                lost=lambda rank, why, cause: self.reports.put(("lost", rank, (why, cause))),
                closing=self._closing,
                aborted=lambda notice: self.reports.put(("aborted", notice)),
                silent=(lambda rank, secs: self.reports.put(("silent", rank, secs)))
                if silent
                else None,
            ),
        )
        self.t0 = time.monotonic()
        self.monitor.start()

    def _closing(self, origin: int, reason: str, settled: bool) -> bool:
        self.reports.put(("closing", origin, reason, settled))
        return self.closing_ends

    def next(self, timeout: float = 5.0):
        return self.reports.get(timeout=timeout)

    def quiet(self, seconds: float, keep_alive: str | None = None) -> bool:
        """True when nothing is reported for ``seconds`` (meanwhile the neighbour end
        ``keep_alive``, if given, sends heartbeats)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if keep_alive:
                self.peer[keep_alive].sendall(wire.encode_ctrl(wire.CTRL_HEARTBEAT))
            try:
                self.reports.get(timeout=min(left, 0.05))
                return False
            except queue.Empty:
                continue
        return True

    def close(self) -> None:
        self.monitor.stop()
        self.monitor.join(5)
        for s in self.socks:
            s.close()


@pytest.fixture
def harness():
    made: list[Harness] = []

    def make(**kwargs) -> Harness:
        h = Harness(**kwargs)
        made.append(h)
        return h

    try:
        yield make
    finally:
        for h in made:
            h.close()


@pytest.mark.timeout(30)
def test_heartbeats_go_out_and_a_killed_neighbour_is_reported_at_once(harness):
    h = harness()
    h.peer["ctrl_right"].settimeout(5)
    beat = h.peer["ctrl_right"].recv(64)
    assert wire.CtrlParser().feed(beat)[0][0] == wire.CTRL_HEARTBEAT
    t_close = time.monotonic()
    h.peer["ctrl_left"].close()  # what the kernel does for a killed process
    kind, rank, why = h.next()
    assert (kind, rank, why) == ("lost", LEFT, ("connection closed", LossCause.CLOSED))
    assert time.monotonic() - t_close < 1.0


@pytest.mark.timeout(30)
def test_silent_neighbour_is_lost_after_peer_timeout_and_not_before(harness):
    h = harness()
    # The right neighbour keeps talking; the left one never says anything.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        h.peer["ctrl_right"].sendall(wire.encode_ctrl(wire.CTRL_HEARTBEAT))
        try:
            kind, rank, why = h.next(timeout=0.05)
            break
        except queue.Empty:
            continue
    elapsed = time.monotonic() - h.t0
    assert (kind, rank) == ("lost", LEFT) and why[1] is LossCause.SILENT
    assert "no heartbeat" in why[0]
    assert SETTINGS.peer_timeout * 0.9 <= elapsed < SETTINGS.peer_timeout + 2.0


@pytest.mark.timeout(30)
def test_a_silent_neighbour_is_reported_once_per_silence_long_before_it_is_lost(harness):
    """A host cut off the network: no FIN, no RST, only silence. It is reported after
    suspect_after, once while the silence lasts, and again after it was heard from."""
    settings = CommSettings(peer_timeout=10.0, suspect_after=0.3, heartbeat_interval=0.05)
    h = harness(settings=settings, silent=True)

    def next_report():  # the right neighbour keeps talking meanwhile
        deadline = time.monotonic() + 5
        while True:
            h.peer["ctrl_right"].sendall(wire.encode_ctrl(wire.CTRL_HEARTBEAT))
            try:
                return h.next(timeout=0.05)
            except queue.Empty:
                assert time.monotonic() < deadline, "no report"

    kind, rank, quiet = next_report()
    assert (kind, rank) == ("silent", LEFT) and 0.3 <= quiet < 2.0
    # Not reported twice while the silence lasts; the talking neighbour never is.
    assert h.quiet(1.0, keep_alive="ctrl_right")
    # Heard from again, then silent again: a new report.
    h.peer["ctrl_left"].sendall(wire.encode_ctrl(wire.CTRL_HEARTBEAT))
    assert next_report()[:2] == ("silent", LEFT)


@pytest.mark.timeout(30)
def test_data_hang_up_alone_waits_for_the_close_grace(harness):
    h = harness()
    t_close = time.monotonic()
    h.peer["data_right"].close()
    kind, rank, why = h.next()
    assert (kind, rank, why) == ("lost", RIGHT, ("connection broken", LossCause.CLOSED))
    assert time.monotonic() - t_close >= SETTINGS.close_grace * 0.9


@pytest.mark.timeout(30)
def test_neighbour_that_closed_on_purpose_is_never_reported_lost(harness):
    h = harness()
    h.peer["ctrl_left"].sendall(wire.encode_closing(7, "new round"))
    assert h.next() == ("closing", 7, "new round", False)
    assert h.monitor.closed_reason(LEFT) == "new round"
    assert h.monitor.closed_reason(RIGHT) is None
    for name in ("ctrl_left", "data_left"):
        h.peer[name].close()
    # The left one says nothing more, past the peer timeout; the right one stays alive.
    assert h.quiet(SETTINGS.peer_timeout + 0.3, keep_alive="ctrl_right")


@pytest.mark.timeout(30)
def test_suspects_are_lost_after_the_grace_unless_they_closed_on_purpose(harness):
    h = harness()
    h.monitor.suspect(RIGHT)
    kind, rank, why = h.next()
    assert (kind, rank, why) == ("lost", RIGHT, ("connection broken", LossCause.CLOSED))
    g = harness()
    g.peer["ctrl_left"].sendall(wire.encode_closing(LEFT, "bye"))
    assert g.next() == ("closing", LEFT, "bye", False)
    g.monitor.suspect(LEFT)
    assert g.next() == ("closing", LEFT, "bye", True)


@pytest.mark.timeout(30)
def test_abort_notice_is_handed_over_with_what_to_relay(harness):
    h = harness()
    message = wire.encode_abort(wire.ABORT_LOST, 9, "rank 9 lost: gone")
    h.peer["ctrl_right"].sendall(message)
    kind, notice = h.next()
    assert kind == "aborted"
    assert (notice.neighbour, notice.kind, notice.lost_rank) == (RIGHT, wire.ABORT_LOST, 9)
    assert notice.message == "rank 9 lost: gone" and notice.relay() == message


@pytest.mark.timeout(30)
def test_read_now_handles_waiting_notices_on_the_callers_thread_once(harness):
    h = harness(closing_ends=True)
    h.peer["ctrl_left"].sendall(wire.encode_closing(2, "done"))
    h.monitor.read_now()  # whichever thread reads it, it is reported exactly once
    assert h.next() == ("closing", 2, "done", False)
    assert h.quiet(0.3, keep_alive="ctrl_right")


@pytest.mark.timeout(30)
def test_stop_ends_the_thread_promptly(harness):
    h = harness()
    t0 = time.monotonic()
    h.monitor.stop()
    h.monitor.join(5)
    assert time.monotonic() - t0 < 1.0
    assert not [t for t in threading.enumerate() if t.name == "test-monitor"]
