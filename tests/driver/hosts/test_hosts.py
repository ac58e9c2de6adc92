"""The host vocabulary and the host manager (pure logic; time is passed in)."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from driver.errors import HostSpecError
from driver.events import (
    HostAdded,
    HostBlacklisted,
    HostBlacklistSkipped,
    HostRemoved,
    HostReturned,
    HostSlotsChanged,
)
from driver.events.log import EventLog
from driver.hosts.manager import BlacklistPolicy, HostManager, cooldown_for
from driver.hosts.slots import (
    HostDiff,
    HostSlots,
    available_slots,
    diff_hosts,
    hosts_in_use,
    order_hosts,
    parse_host_slots,
    split_host,
    total_slots,
)

pytestmark = pytest.mark.unit  # pure logic: no process, no socket


def hs(spec: str) -> tuple[HostSlots, ...]:
    """'a:2,b:1' -> hosts (test shorthand)."""
    return tuple(parse_host_slots(entry, 1) for entry in spec.split(",")) if spec else ()


# ----------------------------------------------------------------------------- HostSlots


@pytest.mark.parametrize(
    "entry, default, expected",
    [
        ("a", 1, HostSlots("a", 1)),
        ("a", 4, HostSlots("a", 4)),
        ("a:2", 4, HostSlots("a", 2)),
        ("  a:3  ", 1, HostSlots("a", 3)),
        ("node-1.example.com:16", 1, HostSlots("node-1.example.com", 16)),
        ("a_b", 1, HostSlots("a_b", 1)),
        ("10.0.0.1:2", 1, HostSlots("10.0.0.1", 2)),
        ("::1", 2, HostSlots("::1", 2)),
        ("[::1]:4", 2, HostSlots("::1", 4)),
        ("[::1]", 2, HostSlots("::1", 2)),
        ("fe80::1%eth0", 1, HostSlots("fe80::1%eth0", 1)),
        ("[fe80::1%eth0]:3", 1, HostSlots("fe80::1%eth0", 3)),
        ("a:007", 1, HostSlots("a", 7)),
    ],
)
def test_parse_host_slots(entry, default, expected):
    assert parse_host_slots(entry, default) == expected


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("", "empty host"),
        ("   ", "empty host"),
        (":2", "empty host"),
        ("[]:2", "empty host"),
        ("a:", "bad slots"),
        ("a:0", "bad slots"),
        ("a:-2", "bad slots"),
        ("a:1.5", "bad slots"),
        ("a:x", "bad slots"),
        ("a: 2", "bad slots"),
        ("a:٣", "bad slots"),  # a non-ASCII digit
        ("a b", "bad host name"),
        ("-a", "bad host name"),  # would be an ssh option
        (".a", "bad host name"),
        ("a;rm", "bad host name"),
        ("a$(x)", "bad host name"),
        ("a:2:3", "more than one ':'"),
        ("[::1", "missing ']'"),
        ("[::1]4", "unexpected '4' after ']'"),
        ("[1.2.3.4]:2", "bad IPv6 address"),
        ("[fe80::1%$(x)]:2", "bad IPv6 address"),
    ],
)
def test_parse_host_slots_errors(entry, problem):
    with pytest.raises(HostSpecError, match=re.escape(problem)):
        parse_host_slots(entry, 1)


def test_split_host_keeps_the_suffix_unchecked():
    assert split_host("h:2379") == ("h", "2379")
    assert split_host("[::1]:x") == ("::1", "x")
    assert split_host("h") == ("h", None)


@pytest.mark.parametrize("host, slots", [("", 1), ("a", 0), ("a", -1), ("a", True), ("a", 1.0)])
def test_host_slots_rejects_bad_values(host, slots):
    with pytest.raises(HostSpecError):
        HostSlots(host, slots)


def test_slot_totals():
    assert total_slots(()) == 0
    assert total_slots(hs("a:2,b:3")) == 5
    assert available_slots(hs("a:2,b:3"), None) == 5
    assert available_slots(hs("a:2,b:3"), 4) == 4
    assert available_slots(hs("a:2,b:3"), 9) == 5


# ----------------------------------------------------------------------------- diff and order


@pytest.mark.parametrize(
    "old, new, diff",
    [
        ("", "", HostDiff()),
        ("a:1", "a:1", HostDiff()),
        ("", "a:1,b:2", HostDiff(added=hs("a:1,b:2"))),
        ("a:1,b:2", "", HostDiff(removed=hs("a:1,b:2"))),
        ("a:1,b:2", "b:2,a:1", HostDiff()),  # order is not a change
        (
            "a:1,b:2",
            "a:3,c:1",
            HostDiff(added=hs("c:1"), removed=hs("b:2"), changed=(("a", 1, 3),)),
        ),
        (
            "a:4,b:2,c:1",
            "c:1,a:2,b:4",
            HostDiff(changed=(("a", 4, 2), ("b", 2, 4))),
        ),  # in the new list's order
    ],
)
def test_diff_hosts(old, new, diff):
    result = diff_hosts(hs(old), hs(new))
    assert result == diff
    assert bool(result) == bool(diff.added or diff.removed or diff.changed)


@pytest.mark.parametrize(
    "known, discovered, ordered",
    [
        ([], "a:1,b:1", "a:1,b:1"),
        (["a", "b"], "b:1,a:1", "a:1,b:1"),  # known hosts keep their order
        (["a", "b"], "c:1,b:2,a:1", "a:1,b:2,c:1"),  # new hosts after them; new slots
        (["a", "b", "c"], "d:1,c:1,e:1,a:1", "a:1,c:1,d:1,e:1"),  # removed hosts drop out
        (["a", "a", "b"], "b:1,a:1", "a:1,b:1"),  # duplicate names in the old order
        (["x"], "", ""),
    ],
)
def test_order_hosts(known, discovered, ordered):
    assert order_hosts(known, hs(discovered)) == hs(ordered)


host_names = st.sampled_from(list("abcdefgh"))
host_lists = st.lists(st.tuples(host_names, st.integers(1, 4)), unique_by=lambda t: t[0]).map(
    lambda pairs: tuple(HostSlots(h, s) for h, s in pairs)
)


@given(known=st.lists(host_names, unique=True), discovered=host_lists)
def test_order_hosts_properties(known, discovered):
    ordered = order_hosts(known, discovered)
    assert sorted(ordered, key=lambda h: h.host) == sorted(discovered, key=lambda h: h.host)
    names = [h.host for h in ordered]
    old = [n for n in names if n in known]
    assert names[: len(old)] == old  # known first ...
    assert old == [n for n in known if n in names]  # ... in their old order
    assert names[len(old) :] == [h.host for h in discovered if h.host not in known]


@given(old=host_lists, new=host_lists)
def test_diff_hosts_properties(old, new):
    diff = diff_hosts(old, new)
    old_names, new_names = {h.host for h in old}, {h.host for h in new}
    assert {h.host for h in diff.added} == new_names - old_names
    assert {h.host for h in diff.removed} == old_names - new_names
    assert {name for name, _, _ in diff.changed} <= old_names & new_names
    assert not diff_hosts(new, new)


# ----------------------------------------------------------------------------- cooldown


@pytest.mark.parametrize(
    "strikes, low, high, expected",
    [
        (1, 10, 300, 10),
        (2, 10, 300, 20),
        (3, 10, 300, 40),
        (5, 10, 300, 160),
        (6, 10, 300, 300),  # 320 clamped
        (50, 10, 300, 300),
        (5000, 10, 300, 300),  # no overflow
        (1, 5, 5, 5),
        (3, 5, 5, 5),
        (1, 0, 0, 0),
        (4, 0, 100, 0),
        (2, 1.5, 100, 3.0),
    ],
)
def test_cooldown_for(strikes, low, high, expected):
    assert cooldown_for(strikes, low, high) == expected


@pytest.mark.parametrize(
    "strikes, low, high", [(0, 10, 300), (-1, 10, 300), (1, 300, 10), (1, -1, 10)]
)
def test_cooldown_for_rejects_bad_input(strikes, low, high):
    with pytest.raises(ValueError):
        cooldown_for(strikes, low, high)


@given(strikes=st.integers(1, 10_000), low=st.floats(0, 1e4), extra=st.floats(0, 1e4))
def test_cooldown_is_clamped_and_never_shrinks(strikes, low, extra):
    high = low + extra
    first, second = cooldown_for(strikes, low, high), cooldown_for(strikes + 1, low, high)
    assert low <= first <= high
    assert first <= second


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(failure_threshold=0),
        dict(failure_window=0),
        dict(cooldown_min=-1),
        dict(cooldown_min=5, cooldown_max=4),
    ],
)
def test_blacklist_policy_validates(kwargs):
    with pytest.raises(ValueError):
        BlacklistPolicy(**kwargs)


# ----------------------------------------------------------------------------- manager

POLICY = BlacklistPolicy(
    failure_threshold=2, failure_window=10.0, cooldown_min=5.0, cooldown_max=40.0
)


def manager(
    hosts: str, min_np: int = 1, max_np: int | None = None, policy: BlacklistPolicy = POLICY
) -> HostManager:
    m = HostManager(policy, min_np=min_np, max_np=max_np)
    m.update(hs(hosts), now=0.0)
    return m


def test_update_reports_changes_and_keeps_order():
    m = HostManager(POLICY, min_np=1)
    assert m.update(hs("a:2,b:1"), now=0) == (HostAdded("a", 2), HostAdded("b", 1))
    assert m.update(hs("c:1,b:1,a:2"), now=1) == (HostAdded("c", 1),)
    assert m.known_hosts == hs("a:2,b:1,c:1")
    assert m.update(hs("c:3,a:2"), now=2) == (HostSlotsChanged("c", 1, 3), HostRemoved("b", 1))
    assert m.known_hosts == m.usable_hosts == hs("a:2,c:3")
    assert m.update(hs("b:1,c:3,a:2"), now=3) == (HostAdded("b", 1),)
    assert m.known_hosts == hs("a:2,c:3,b:1")  # a returning host counts as new: at the end
    assert m.update(hs("b:1,c:3,a:2"), now=4) == ()


def test_an_empty_result_keeps_the_hosts_the_job_has():
    """Taken literally, an empty list mid-run would stop every worker and lose the
    committed state with them: it changes nothing, and ``lists_none`` says it came."""
    m = HostManager(POLICY, min_np=1)
    assert m.lists_none and m.update((), now=0) == () and m.known_hosts == ()
    m.update(hs("a:2,b:1"), now=1)
    assert not m.lists_none
    assert m.update((), now=2) == ()
    assert m.lists_none and m.known_hosts == m.usable_hosts == hs("a:2,b:1")
    # A later result is diffed against the kept hosts, and the cooldowns still end.
    m.host_lost("a", now=3)
    assert m.update((), now=3 + POLICY.cooldown_min) == (HostReturned("a"),)
    assert m.update(hs("b:1"), now=9) == (HostRemoved("a", 2),)
    assert not m.lists_none and m.known_hosts == hs("b:1")


def test_a_driver_taking_over_while_discovery_lists_none_keeps_the_hosts_in_use():
    in_use = hosts_in_use([("b", 0), ("a", 2), ("b", 1), ("a", 0)])
    assert in_use == hs("b:2,a:3")
    m = HostManager(POLICY, min_np=1)
    m.update((), now=0)
    assert m.keep_in_use(in_use) == (HostAdded("b", 2), HostAdded("a", 3))
    assert m.usable_hosts == in_use and m.lists_none
    # Hosts listed (or kept) already: discovery's word stands.
    assert manager("c:1").keep_in_use(in_use) == () and m.keep_in_use(hs("d:1")) == ()


def test_available_slots_are_capped_by_max_np():
    assert manager("a:2,b:3").available_slots == 5
    assert manager("a:2,b:3", max_np=4).available_slots == 4


def test_one_failure_does_not_blacklist():
    m = manager("a:1,b:1")
    assert m.record_failure("a", now=1) == ()
    assert not m.is_blacklisted("a")


def test_failures_within_the_window_blacklist_the_host():
    m = manager("a:2,b:2", min_np=2)
    m.record_failure("a", now=1)
    events = m.record_failure("a", now=5)
    assert events == (HostBlacklisted("a", failures=2, strikes=1, cooldown=5.0, until=10.0),)
    assert m.is_blacklisted("a") and m.blacklisted_hosts == ("a",)
    assert m.usable_hosts == hs("b:2") and m.known_hosts == hs("a:2,b:2")
    assert m.strikes("a") == 1
    assert m.next_release_time() == 10.0


def test_failures_outside_the_window_do_not_add_up():
    m = manager("a:1,b:1")
    assert m.record_failure("a", now=0) == ()
    assert m.record_failure("a", now=10) == ()  # the first one is exactly window old
    assert m.record_failure("a", now=25) == ()
    assert not m.is_blacklisted("a")


def test_failures_on_other_hosts_do_not_add_up():
    m = manager("a:1,b:1,c:1")
    m.record_failure("a", now=1)
    assert m.record_failure("b", now=2) == ()
    assert m.blacklisted_hosts == ()


def test_host_returns_after_its_cooldown():
    m = manager("a:1,b:1")
    m.record_failure("a", 1)
    m.record_failure("a", 2)  # out until 7
    assert m.release_expired(6.9) == ()
    assert m.usable_hosts == hs("b:1")
    assert m.release_expired(7.0) == (HostReturned("a"),)
    assert m.usable_hosts == hs("a:1,b:1")  # back in its old place
    assert m.next_release_time() is None
    assert m.release_expired(100) == ()


def test_cooldown_grows_with_each_strike_up_to_the_maximum():
    m = manager("a:1,b:1")
    now, cooldowns = 0.0, []
    for _ in range(6):
        m.record_failure("a", now)
        (event,) = m.record_failure("a", now)
        assert isinstance(event, HostBlacklisted)
        cooldowns.append(event.cooldown)
        now = event.until
        assert m.release_expired(now) == (HostReturned("a"),)
    assert cooldowns == [5, 10, 20, 40, 40, 40]
    assert m.strikes("a") == 6


def test_returned_host_needs_the_full_threshold_again():
    m = manager("a:1,b:1")
    m.record_failure("a", 1)
    m.record_failure("a", 2)
    m.release_expired(7)
    assert m.record_failure("a", 8) == ()  # the failures before the blacklisting are gone
    assert not m.is_blacklisted("a")


def test_failures_of_a_blacklisted_host_are_ignored():
    m = manager("a:2,b:1")
    m.record_failure("a", 1)
    m.record_failure("a", 1)
    assert m.record_failure("a", 2) == ()  # its other worker going down
    assert m.record_failure("a", 3) == ()
    assert m.strikes("a") == 1


def test_record_failure_and_update_release_expired_cooldowns_first():
    m = manager("a:1,b:1")
    m.record_failure("a", 1)
    m.record_failure("a", 1)  # out until 6
    assert m.record_failure("b", 6) == (HostReturned("a"),)
    m2 = manager("a:1,b:1")
    m2.record_failure("a", 1)
    m2.record_failure("a", 1)
    assert m2.update(hs("a:1,b:1,c:1"), 6) == (HostReturned("a"), HostAdded("c", 1))


def test_never_blacklisted_below_min_np():
    m = manager("a:4", min_np=2)
    for now in range(20):
        events = m.record_failure("a", float(now))
        assert not any(isinstance(e, HostBlacklisted) for e in events)
    assert m.usable_hosts == hs("a:4")
    assert m.strikes("a") == 0


def test_skip_event_says_why_and_window_restarts():
    m = manager("a:2,b:2", min_np=3)
    assert m.record_failure("a", 1) == ()
    assert m.record_failure("a", 2) == (
        HostBlacklistSkipped("a", failures=2, remaining_slots=2, min_np=3),
    )
    assert m.record_failure("a", 3) == ()  # counting starts afresh after a skip


def test_protection_counts_only_usable_hosts():
    m = manager("a:1,b:1,c:1", min_np=2)
    m.record_failure("a", 1)
    assert isinstance(m.record_failure("a", 1)[0], HostBlacklisted)  # b + c = 2 left
    m.record_failure("b", 2)
    assert m.record_failure("b", 2) == (HostBlacklistSkipped("b", 2, 1, 2),)  # only c would be left


def test_protection_can_be_turned_off_and_all_hosts_blacklisted():
    policy = BlacklistPolicy(
        failure_threshold=1, failure_window=10, cooldown_min=5, cooldown_max=5, protect_min_np=False
    )
    m = manager("a:1", min_np=1, policy=policy)
    assert isinstance(m.record_failure("a", 0)[0], HostBlacklisted)
    assert m.all_blacklisted and m.usable_hosts == ()
    assert m.available_slots == 0


def test_all_blacklisted_is_false_without_hosts():
    assert not HostManager(POLICY, min_np=1).all_blacklisted


def test_blacklist_survives_the_host_leaving_and_coming_back():
    m = manager("a:1,b:1")
    m.record_failure("a", 1)
    m.record_failure("a", 1)  # out until 6
    m.update(hs("b:1"), 2)
    assert m.blacklisted_hosts == ("a",)
    assert m.update(hs("b:1,a:1"), 3) == (HostAdded("a", 1),)
    assert m.usable_hosts == hs("b:1")  # still cooling down
    assert m.release_expired(6) == (HostReturned("a"),)
    assert m.usable_hosts == hs("b:1,a:1")


def test_unlisted_host_can_be_blacklisted_regardless_of_min_np():
    # A host that discovery no longer lists takes no slots away when blacklisted.
    m = manager("b:1", min_np=1)
    m.record_failure("gone", 1)
    assert isinstance(m.record_failure("gone", 1)[0], HostBlacklisted)
    assert m.usable_hosts == hs("b:1")


def test_zero_cooldown_returns_at_once():
    policy = BlacklistPolicy(failure_threshold=1, failure_window=1, cooldown_min=0, cooldown_max=0)
    m = manager("a:1,b:1", policy=policy)
    (event,) = m.record_failure("a", 3)
    assert isinstance(event, HostBlacklisted) and event.cooldown == 0 and event.until == 3
    assert m.release_expired(3) == (HostReturned("a"),)


@pytest.mark.parametrize(
    "event, kind, text",
    [
        (HostAdded("a", 2), "host_added", "host a added with 2 slot(s)"),
        (HostRemoved("a", 2), "host_removed", "host a removed (had 2 slot(s))"),
        (HostSlotsChanged("a", 2, 4), "host_slots_changed", "host a now has 4 slot(s) (was 2)"),
        (
            HostBlacklisted("a", 3, 2, 20.0, 120.0),
            "host_blacklisted",
            "host a blacklisted for 20 s after 3 worker failure(s) (strike 2)",
        ),
        (
            HostBlacklistSkipped("a", 3, 1, 2),
            "host_blacklist_skipped",
            "host a kept despite 3 worker failure(s): without it 1 slot(s) would remain, fewer than min_np 2",
        ),
        (HostReturned("a"), "host_back", "host a back from the blacklist"),
    ],
)
def test_events_are_loggable(event, kind, text):
    record = EventLog(None, stream=io.StringIO()).emit(event)
    assert record["kind"] == kind and record["host"] == "a"
    assert json.loads(json.dumps(record)) == record
    assert str(event) == text


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 1000)), max_size=60), st.integers(1, 6)
)
def test_manager_never_leaves_fewer_than_min_np_slots(failures, min_np):
    m = manager("a:2,b:2,c:2", min_np=min_np)
    for host, now in sorted(failures, key=lambda f: f[1]):
        m.record_failure(host, now)
        assert total_slots(m.usable_hosts) >= min_np
        assert set(m.usable_hosts) <= set(m.known_hosts)


# ----------------------------------------------------------------------------- absurd sizes


@pytest.mark.parametrize(
    "entry, problem",
    [
        ("localhost:99999999999999999999999", "at most 1024 per host"),
        ("localhost:" + "9" * 5000, "at most 1024 per host"),  # past int()'s digit limit
        ("localhost:1025", "at most 1024 per host"),
        ("a" * 254, "DNS allows 253"),
        (".".join(["b" * 63] * 4) + "x", "DNS allows 253"),
        ("a" * 64 + ".example.com:2", "DNS allows 63"),
    ],
    ids=["huge-slots", "5000-digits", "1025-slots", "long-name", "long-fqdn", "long-label"],
)
def test_absurd_entries_are_one_line_errors_naming_them(entry, problem):
    with pytest.raises(HostSpecError) as caught:
        parse_host_slots(entry, 1)
    message = str(caught.value)
    assert problem in message and "\n" not in message and len(message) < 400
    assert entry[:20] in message  # the entry is named, cut to a readable length


def test_the_largest_sane_entries_are_accepted():
    assert parse_host_slots("localhost:1024", 1) == HostSlots("localhost", 1024)
    assert parse_host_slots("localhost:0004", 1) == HostSlots("localhost", 4)
    name = ".".join(["c" * 63] * 3) + "." + "d" * 61  # 253 characters, labels of 63
    assert parse_host_slots(name, 2) == HostSlots(name, 2)
    with pytest.raises(HostSpecError, match="at most 1024"):
        HostSlots("a", 1025)
