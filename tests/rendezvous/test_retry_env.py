"""Pure units of the shared floor: the backoff schedule, the typed environment readers,
and the one host:port parser."""

from __future__ import annotations

import threading

import pytest

from rendezvous import env
from rendezvous.errors import RendezvousConfigError
from rendezvous.net.url import Endpoint
from rendezvous.retry import Backoff

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_backoff_doubles_up_to_the_cap_and_stops_before_the_deadline():
    clock = FakeClock()
    backoff = Backoff.within(1.0, initial=0.1, cap=0.4, clock=clock, sleep=clock.sleep)
    pauses = []
    while True:
        before = clock.now
        if not backoff.pause():
            break
        pauses.append(round(clock.now - before, 6))
    assert pauses == [0.1, 0.2, 0.4]  # the next (0.4) would pass 1.0
    assert clock.now == pytest.approx(0.7)


def test_backoff_clip_tries_once_more_at_the_deadline():
    clock = FakeClock()
    backoff = Backoff.within(0.5, initial=0.2, cap=1.0, clock=clock, sleep=clock.sleep)
    assert backoff.pause(clip=True) and backoff.pause(clip=True)  # 0.2, then 0.3 (clipped)
    assert clock.now == pytest.approx(0.5)
    assert not backoff.pause(clip=True)


def test_backoff_without_deadline_and_with_stop():
    stop = threading.Event()
    backoff = Backoff(None, initial=0.001, cap=0.001, stop=stop)
    assert backoff.pause() and backoff.remaining() == float("inf")
    stop.set()
    assert not backoff.pause()


def test_backoff_rejects_a_bad_schedule():
    with pytest.raises(ValueError):
        Backoff(None, initial=0, cap=1)
    with pytest.raises(ValueError):
        Backoff(None, initial=2, cap=1)


def test_env_readers_name_the_variable():
    environ = {env.ENV_PEER_TIMEOUT: "abc", env.ENV_LEASE_TTL: "0", "X": "yes"}
    with pytest.raises(RendezvousConfigError, match=env.ENV_PEER_TIMEOUT):
        env.number(env.ENV_PEER_TIMEOUT, 30.0, environ)
    with pytest.raises(RendezvousConfigError, match=env.ENV_LEASE_TTL):
        env.integer(env.ENV_LEASE_TTL, 10, environ, minimum=1)
    assert env.number(env.ENV_CONNECT_TIMEOUT, 30.0, environ) == 30.0
    assert env.flag("X", False, environ) is True
    assert env.text("MISSING", "d", environ) == "d"


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        (env.ENV_PEER_TIMEOUT, "1e-9", "is out of range: use seconds from 0.5 to 86400"),
        (env.ENV_CONNECT_TIMEOUT, "1e-9", "is out of range: use seconds from 0.5 to 86400"),
        (env.ENV_PEER_TIMEOUT, "nan", "is out of range"),
        (env.ENV_PEER_TIMEOUT, "abc", "is not a number: use seconds from 0.5"),
        (env.ENV_CONNECT_TIMEOUT, "-1", "is out of range"),
        (env.ENV_LEASE_TTL, "2.5", "is not a number: use whole seconds from 1 to 3600"),
        (env.ENV_LEASE_TTL, "0", "is out of range: use whole seconds from 1 to 3600"),
    ],
)
def test_a_tunable_outside_its_range_is_one_line_naming_it_and_the_range(name, raw, message):
    with pytest.raises(RendezvousConfigError) as caught:
        env.check_tuning({name: raw})
    assert str(caught.value) == f"{name}={raw!r} {message}" or (
        str(caught.value).startswith(f"{name}={raw!r} {message}")
    )
    assert env.tuned(name, 7.0, {}) == 7.0


def test_tunables_inside_their_range_are_taken():
    environ = {env.ENV_PEER_TIMEOUT: "2", env.ENV_CONNECT_TIMEOUT: "0.5", env.ENV_LEASE_TTL: "3"}
    env.check_tuning(environ)
    assert env.tuned(env.ENV_LEASE_TTL, 10, environ) == 3


@pytest.mark.parametrize(
    "text, host, port",
    [
        ("10.0.0.1:2379", "10.0.0.1", 2379),
        ("[::1]:80", "::1", 80),
        ("node-1.example:9", "node-1.example", 9),
    ],
)
def test_endpoint_parse(text, host, port):
    endpoint = Endpoint.parse(text)
    assert (endpoint.host, endpoint.port) == (host, port)
    assert Endpoint.parse(str(endpoint)) == endpoint


@pytest.mark.parametrize("text", ["::1:80", "host", "host:0", "host:70000", ":80", "[::1]80"])
def test_endpoint_parse_refuses(text):
    with pytest.raises(RendezvousConfigError, match="ring peer"):
        Endpoint.parse(text, "ring peer")


def test_endpoint_port_zero_for_binding():
    assert Endpoint.parse("0.0.0.0:0", allow_port_zero=True).port == 0
