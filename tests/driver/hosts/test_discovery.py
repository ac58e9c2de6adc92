"""Host discovery: parsing a script's output, running real scripts, and is_local_host."""

from __future__ import annotations

import os
import socket
import stat
import textwrap
import threading
import time

import pytest

from driver.errors import DiscoveryError, UnknownDiscoveryError
from driver.hosts import registry
from driver.hosts.discovery import DiscoverySettings, HostDiscovery
from driver.hosts.fixed import FixedDiscovery
from driver.hosts.script import ScriptDiscovery, parse_discovery_output
from driver.hosts.slots import HostSlots
from rendezvous.net.addresses import is_local_host

SOURCE = "discovery script ./d.sh"


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("", ()),
        ("\n\n   \n", ()),
        ("# only a comment\n", ()),
        ("a\n", (HostSlots("a", 1),)),
        ("a:4\nb\n", (HostSlots("a", 4), HostSlots("b", 1))),
        ("  a:2  \n\tb:3\t\n", (HostSlots("a", 2), HostSlots("b", 3))),
        ("# header\na:2 # rack 1\n\nb # no slots\n#c:9\n", (HostSlots("a", 2), HostSlots("b", 1))),
        ("a:2#tight comment\n", (HostSlots("a", 2),)),
        ("a\r\nb:2\r\n", (HostSlots("a", 1), HostSlots("b", 2))),
        ("b:1\na:1\n", (HostSlots("b", 1), HostSlots("a", 1))),  # discovery order is kept
        (
            "10.0.0.1:8\n[fd00::2]:2\n::1\n",
            (HostSlots("10.0.0.1", 8), HostSlots("fd00::2", 2), HostSlots("::1", 1)),
        ),
        ("node-1.example.com:16", (HostSlots("node-1.example.com", 16),)),  # no final newline
    ],
)
def test_parse_discovery_output(text, hosts):
    assert parse_discovery_output(text, 1, SOURCE) == hosts


def test_default_slots_apply_to_hosts_without_slots():
    assert parse_discovery_output("a\nb:2\n", 3, SOURCE) == (HostSlots("a", 3), HostSlots("b", 2))


@pytest.mark.parametrize(
    "text, line_number, line, problem",
    [
        ("a:x\n", 1, "a:x", "bad slots"),
        ("a\n\n# c\nb:0\n", 4, "b:0", "bad slots"),
        ("a:-1\n", 1, "a:-1", "bad slots"),
        ("a b\n", 1, "a b", "bad host name"),
        (":3\n", 1, ":3", "empty host"),
        ("a:2:3\n", 1, "a:2:3", "more than one ':'"),
        ("a:2\nb\na:4 # again\n", 3, "a:4 # again", "already listed on line 1"),
        ("a\na\n", 2, "a", "already listed on line 1"),
        ("[::1]:2\n::1\n", 2, "::1", "already listed on line 1"),
    ],
)
def test_bad_output_names_source_line_and_text(text, line_number, line, problem):
    with pytest.raises(DiscoveryError) as caught:
        parse_discovery_output(text, 1, SOURCE)
    message = str(caught.value)
    assert message.startswith(f"{SOURCE}: line {line_number} {line!r}")
    assert problem in message
    assert "\n" not in message


# ----------------------------------------------------------------------------- fixed


def test_fixed_discovery_returns_its_hosts():
    hosts = [HostSlots("a", 2), HostSlots("b", 1)]
    discovery = FixedDiscovery(hosts)
    assert isinstance(discovery, HostDiscovery)
    assert discovery.find_hosts() == tuple(hosts)
    hosts.append(HostSlots("c", 1))  # the caller's list is copied
    assert discovery.find_hosts() == (HostSlots("a", 2), HostSlots("b", 1))


def test_host_discovery_is_abstract():
    with pytest.raises(TypeError):
        HostDiscovery()  # type: ignore[abstract]


# ----------------------------------------------------------------------------- scripts


def write_script(tmp_path, body: str, name: str = "discover.sh", mode: int = 0o755) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(mode)
    return str(path)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_script_hosts(tmp_path):
    path = write_script(
        tmp_path,
        """\
        echo "# hosts of the job"
        echo a:2
        echo
        echo b   # default slots
        """,
    )
    discovery = ScriptDiscovery(path, default_slots=4, timeout=10)
    assert isinstance(discovery, HostDiscovery)
    assert discovery.find_hosts() == (HostSlots("a", 2), HostSlots("b", 4))
    # a second call runs the script again
    assert discovery.find_hosts() == (HostSlots("a", 2), HostSlots("b", 4))


def test_script_output_can_change_between_calls(tmp_path):
    state = tmp_path / "hosts.txt"
    path = write_script(tmp_path, f'cat "{state}"\n')
    discovery = ScriptDiscovery(path, default_slots=1, timeout=10)
    state.write_text("a:1\n")
    assert discovery.find_hosts() == (HostSlots("a", 1),)
    state.write_text("a:1\nb:2\n")
    assert discovery.find_hosts() == (HostSlots("a", 1), HostSlots("b", 2))


def test_script_with_no_hosts_is_not_an_error(tmp_path):
    path = write_script(tmp_path, "exit 0\n")
    assert ScriptDiscovery(path, 1, timeout=10).find_hosts() == ()


def test_script_exiting_non_zero_names_script_status_and_stderr_tail(tmp_path):
    path = write_script(
        tmp_path,
        """\
        echo a:1
        for i in 1 2 3 4 5 6 7; do echo "noise $i" >&2; done
        echo "inventory API said 503" >&2
        exit 3
        """,
    )
    with pytest.raises(DiscoveryError) as caught:
        ScriptDiscovery(path, 1, timeout=10).find_hosts()
    message = str(caught.value)
    assert path in message and "exited with status 3" in message
    assert message.endswith("inventory API said 503")
    assert "noise 7" in message and "noise 1" not in message  # only the tail
    assert "\n" not in message


def test_script_exiting_non_zero_without_stderr(tmp_path):
    path = write_script(tmp_path, "exit 1\n")
    with pytest.raises(DiscoveryError, match=r"exited with status 1 \(no stderr output\)"):
        ScriptDiscovery(path, 1, timeout=10).find_hosts()


def test_script_killed_by_a_signal(tmp_path):
    path = write_script(tmp_path, "kill -TERM $$\n")
    with pytest.raises(DiscoveryError, match=r"was killed by SIGTERM"):
        ScriptDiscovery(path, 1, timeout=10).find_hosts()


def test_long_stderr_tail_is_cut(tmp_path):
    path = write_script(
        tmp_path,
        """\
        python3 -c 'import sys; sys.stderr.write("x" * 5000 + "END")'
        exit 2
        """,
    )
    with pytest.raises(DiscoveryError) as caught:
        ScriptDiscovery(path, 1, timeout=10).find_hosts()
    message = str(caught.value)
    assert message.endswith("END") and len(message) < 1000


def test_script_printing_a_bad_line(tmp_path):
    path = write_script(tmp_path, "echo a:2\necho 'b:two'\n")
    with pytest.raises(DiscoveryError) as caught:
        ScriptDiscovery(path, 1, timeout=10).find_hosts()
    message = str(caught.value)
    assert path in message and "line 2 'b:two'" in message and "bad slots" in message


def test_hanging_script_times_out_and_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    # The script starts a child that would outlive it, then hangs itself.
    path = write_script(
        tmp_path,
        f"""\
        sleep 300 &
        echo $! > "{pid_file}"
        echo a:1
        sleep 300
        """,
    )
    discovery = ScriptDiscovery(path, 1, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(DiscoveryError) as caught:
        discovery.find_hosts()
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert path in message and "did not finish within 0.5 s" in message
    child = int(pid_file.read_text())
    # SIGKILL went to the whole group; the child is dead (reaped by init) or a zombie
    # about to be. Poll without sleeping a fixed time: a bounded wait on the /proc entry.
    deadline = time.monotonic() + 5
    while process_exists(child) and _state(child) != "Z" and time.monotonic() < deadline:
        os.sched_yield()
    assert not process_exists(child) or _state(child) == "Z"


def test_a_cancelled_run_kills_the_script_and_its_children_and_no_run_follows(tmp_path):
    """The job ends while the script runs (``cancel``, from another thread): its group
    is killed at once, ``find_hosts`` says why, and no later run starts."""
    pid_file = tmp_path / "child.pid"
    path = write_script(
        tmp_path,
        f'sleep 300 &\necho $! > "{pid_file}.new"\nmv "{pid_file}.new" "{pid_file}"\nwait\n',
    )
    discovery = ScriptDiscovery(path, 1, timeout=60)
    errors: list[DiscoveryError] = []

    def run() -> None:
        try:
            discovery.find_hosts()
        except DiscoveryError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the script did not start"
        os.sched_yield()
    discovery.cancel()
    thread.join(timeout=10)
    assert not thread.is_alive() and "was stopped: the job ends" in str(errors[0])
    child = int(pid_file.read_text())
    while process_exists(child) and _state(child) != "Z":
        assert time.monotonic() < deadline + 10, "the script's child lives on"
        os.sched_yield()
    with pytest.raises(DiscoveryError, match="was not run: the job ends"):
        discovery.find_hosts()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_script_that_exits_but_leaves_its_output_open_times_out(tmp_path):
    # A background child keeps stdout open after the script exits: still bounded.
    path = write_script(tmp_path, "echo a:1\nsleep 300 &\nexit 0\n")
    with pytest.raises(DiscoveryError, match=r"did not finish within"):
        ScriptDiscovery(path, 1, timeout=0.5).find_hosts()


def test_script_gone_after_configuration(tmp_path):
    path = str(tmp_path / "deleted.sh")
    with pytest.raises(DiscoveryError, match=r"discovery script .*deleted.sh could not be run"):
        ScriptDiscovery(path, 1, timeout=10).find_hosts()


def test_non_executable_script(tmp_path):
    path = write_script(tmp_path, "echo a\n", mode=stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(DiscoveryError, match=r"could not be run: Permission denied"):
        ScriptDiscovery(path, 1, timeout=10).find_hosts()


def test_script_without_interpreter_line(tmp_path):
    path = tmp_path / "binary"
    path.write_bytes(b"\x7fELF-not-really")
    path.chmod(0o755)
    with pytest.raises(DiscoveryError, match=r"could not be run"):
        ScriptDiscovery(str(path), 1, timeout=10).find_hosts()


def test_script_gets_no_stdin(tmp_path):
    # "read" on a closed stdin returns at once instead of hanging the driver.
    path = write_script(tmp_path, "read line; echo a:${line:-1}\n")
    assert ScriptDiscovery(path, 1, timeout=10).find_hosts() == (HostSlots("a", 1),)


# ----------------------------------------------------------------------------- local hosts


def _outbound_address() -> str:
    """This machine's address on its default route (UDP connect sends nothing), or the
    loopback address when there is no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST",
        "localhost.localdomain",
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "[::1]",
        " localhost ",
    ],
)
def test_loopback_names_are_local(host):
    assert is_local_host(host)


def test_own_names_and_addresses_are_local():
    assert is_local_host(socket.gethostname())
    assert is_local_host(socket.gethostname().upper())
    assert is_local_host(socket.getfqdn())
    assert is_local_host(_outbound_address())


@pytest.mark.parametrize(
    "host", ["", "198.51.100.7", "203.0.113.9", "2001:db8::1", "224.0.0.1", "no-such-host.invalid"]
)
def test_other_hosts_are_not_local(host):
    assert not is_local_host(host)


def test_is_local_host_is_cached():
    is_local_host.cache_clear()
    is_local_host("no-such-host.invalid")
    is_local_host("no-such-host.invalid")
    assert is_local_host.cache_info().hits == 1


def test_absurd_slot_count_in_discovery_output_names_the_line():
    text = "a:2\nlocalhost:99999999999999999999999\n"
    with pytest.raises(DiscoveryError) as caught:
        parse_discovery_output(text, 1, SOURCE)
    message = str(caught.value)
    assert "line 2" in message and "localhost:9999" in message and "at most 1024" in message


def test_discovery_listing_too_many_slots_stops_at_once():
    # A million lines are not all parsed: the listing is refused at the first line past
    # the bound, without a host list of that size ever being built.
    text = "".join(f"h{i}:1024\n" for i in range(1_000_000))
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match=r"lists 66560 slots in all; at most 65536"):
        parse_discovery_output(text, 1, SOURCE)
    assert time.monotonic() - started < 5


# ----------------------------------------------------------------------------- sources by name


def test_the_flags_pick_a_source_of_hosts_by_name():
    fixed = DiscoverySettings(hosts=(HostSlots("a", 2),))
    assert registry.source_name(fixed) == "fixed"
    assert registry.make_discovery("fixed", fixed).find_hosts() == (HostSlots("a", 2),)
    script = DiscoverySettings(script="/bin/true", default_slots=3)
    assert registry.source_name(script) == "script"
    made = registry.make_discovery("script", script)
    assert isinstance(made, ScriptDiscovery) and made.default_slots == 3
    with pytest.raises(UnknownDiscoveryError, match="unknown host discovery 'kubernetes'"):
        registry.make_discovery("kubernetes", fixed)


def test_a_source_registered_by_name_is_made_from_the_settings(monkeypatch):
    """The seam a new source of hosts plugs into: a creator under a name in ``SOURCES``."""

    class Joined(HostDiscovery):
        def __init__(self, slots: int):
            self.slots = slots

        def find_hosts(self) -> tuple[HostSlots, ...]:
            return (HostSlots("joined-1", self.slots),)

    monkeypatch.setitem(registry.SOURCES, "joined", lambda s: Joined(s.default_slots))
    made = registry.make_discovery("joined", DiscoverySettings(default_slots=4))
    assert made.find_hosts() == (HostSlots("joined-1", 4),)
