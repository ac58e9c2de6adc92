"""elastic-run's command line: every flag parses, defaults resolve, bad use is one line."""

from __future__ import annotations

import os
import stat

import pytest

from driver.config import JobConfig, parse_args
from driver.errors import DriverError, UsageError
from driver.flags import (
    DEFAULT_BLACKLIST_COOLDOWN_RANGE,
    DEFAULT_DISCOVERY_INTERVAL,
    DEFAULT_ELASTIC_TIMEOUT,
    DEFAULT_PS_CHECKPOINT_INTERVAL,
    DEFAULT_START_TIMEOUT,
    build_parser,
)
from driver.horovodrun_flags import REFUSED
from driver.hosts.manager import BlacklistPolicy
from driver.hosts.slots import HostSlots
from rendezvous.errors import ElasticError
from rendezvous.net.url import Endpoint, StoreURL

CMD = ["python", "train.py"]


def parse(*argv: str) -> JobConfig:
    return parse_args(list(argv), new_job_id=lambda: "job-fixed")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\necho localhost:2\n")
    path.chmod(0o755)
    return str(path)


# ----------------------------------------------------------------------------- defaults


def test_np_alone_is_a_static_job_on_localhost():
    config = parse("-np", "2", *CMD)
    assert config.command == tuple(CMD)
    assert (config.np, config.min_np, config.max_np) == (2, 2, 2)
    assert config.hosts == (HostSlots("localhost", 2),)
    assert config.discovery_script is None and not config.uses_discovery


def test_defaults():
    config = parse("-np", "1", *CMD)
    assert config.slots_per_host == 1
    assert config.discovery_interval == DEFAULT_DISCOVERY_INTERVAL == 1.0
    assert config.rendezvous == StoreURL("embedded", ())
    assert config.job_id == "job-fixed"
    assert config.reset_limit is None
    assert config.blacklist_cooldown_range == DEFAULT_BLACKLIST_COOLDOWN_RANGE == (10.0, 300.0)
    assert config.elastic_timeout == DEFAULT_ELASTIC_TIMEOUT == 600.0
    assert config.start_timeout == DEFAULT_START_TIMEOUT == 120.0
    assert config.launcher == "auto"
    assert (config.num_ps, config.ps_mode, config.ps_checkpoint_dir) == (0, "async", None)
    assert config.ps_checkpoint_interval == DEFAULT_PS_CHECKPOINT_INTERVAL == 60.0
    assert (config.chaos_kill_interval, config.chaos_max_kills) == (None, None)
    assert (config.log_dir, config.events_file, config.verbosity) == (None, None, 0)
    assert config.spares == 0


def test_random_job_id_by_default():
    first, second = parse_args(["-np", "1", *CMD]), parse_args(["-np", "1", *CMD])
    assert first.job_id != second.job_id
    assert first.job_id.isalnum()


def test_config_is_frozen():
    config = parse("-np", "1", *CMD)
    with pytest.raises(AttributeError):
        config.np = 3  # type: ignore[misc]


def test_every_flag_sets_its_field(script):
    config = parse(
        "-np",
        "4",
        "--min-np",
        "2",
        "--max-np",
        "8",
        "--host-discovery-script",
        script,
        "--slots-per-host",
        "3",
        "--discovery-interval",
        "0.5",
        "--rendezvous",
        "etcd://h1:2379,h2:2380",
        "--job-id",
        "my.job_1",
        "--reset-limit",
        "5",
        "--blacklist-cooldown-range",
        "1",
        "20",
        "--elastic-timeout",
        "30",
        "--start-timeout",
        "15",
        "--launcher",
        "ssh",
        "--num-ps",
        "2",
        "--ps-mode",
        "sync",
        "--ps-checkpoint-dir",
        "/ckpt",
        "--ps-checkpoint-interval",
        "5",
        "--chaos-kill-interval",
        "2.5",
        "--chaos-max-kills",
        "3",
        "--log-dir",
        "/logs",
        "--events",
        "ev.jsonl",
        "-v",
        "-v",
        *CMD,
    )
    assert config == JobConfig(
        command=tuple(CMD),
        np=4,
        min_np=2,
        max_np=8,
        hosts=(),
        discovery_script=script,
        slots_per_host=3,
        slots_given=True,
        discovery_interval=0.5,
        rendezvous=StoreURL("etcd", (Endpoint("h1", 2379), Endpoint("h2", 2380))),
        job_id="my.job_1",
        job_id_given=True,
        network_interface=None,
        driver_address=None,
        reset_limit=5,
        blacklist_cooldown_range=(1.0, 20.0),
        elastic_timeout=30.0,
        start_timeout=15.0,
        launcher="ssh",
        num_ps=2,
        ps_mode="sync",
        ps_checkpoint_dir="/ckpt",
        ps_checkpoint_interval=5.0,
        chaos_kill_interval=2.5,
        chaos_max_kills=3,
        log_dir="/logs",
        events_file="ev.jsonl",
        verbosity=2,
    )
    assert config.uses_discovery


def test_spares_are_per_host_and_given_to_the_job():
    assert parse("-np", "4", "--spares", "2", *CMD).spares == 2
    assert parse("-np", "4", "--spares", "0", *CMD).spares == 0


def test_blacklist_policy_takes_the_cooldown_range():
    config = parse("-np", "1", "--blacklist-cooldown-range", "2", "7", *CMD)
    assert config.blacklist_policy == BlacklistPolicy(cooldown_min=2.0, cooldown_max=7.0)


def test_checkpoint_interval_without_dir_is_accepted():
    # (with shards: a ps flag without --num-ps is an error, see below)
    config = parse("-np", "1", "--num-ps", "1", "--ps-checkpoint-interval", "9", *CMD)
    assert config.ps_checkpoint_interval == 9.0 and config.ps_checkpoint_dir is None


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--ps-mode", "sync"),
        ("--ps-checkpoint-dir", "/ckpt"),
        ("--ps-checkpoint-interval", "9"),
        ("--ps-replicas", "1"),
        ("--ps-replicas", "0"),
    ],
)
@pytest.mark.parametrize("num_ps", [[], ["--num-ps", "0"]])
def test_ps_flags_without_shards_are_an_error_naming_the_flag(flag, value, num_ps):
    with pytest.raises(UsageError) as caught:
        parse("-np", "1", *num_ps, flag, value, *CMD)
    assert str(caught.value).startswith(f"{flag} needs --num-ps")


def test_ps_flags_with_shards_keep_their_defaults():
    config = parse("-np", "1", "--num-ps", "2", *CMD)
    assert (config.ps_mode, config.ps_checkpoint_interval) == ("async", 60.0)
    assert config.ps_replicas == 0
    assert parse("-np", "1", "--num-ps", "2", "--ps-replicas", "1", *CMD).ps_replicas == 1


@pytest.mark.parametrize(
    "argv, expected",
    [
        # (np, min_np, max_np, hosts)
        (["-np", "3"], (3, 3, 3, (HostSlots("localhost", 3),))),
        (["-np", "2", "--max-np", "4"], (2, 2, 4, (HostSlots("localhost", 2),))),
        (["-np", "2", "--min-np", "1"], (2, 1, 2, (HostSlots("localhost", 2),))),
        (["-H", "a:2,b:2"], (4, 4, None, (HostSlots("a", 2), HostSlots("b", 2)))),
        (["-H", "a:2,b:2", "-np", "3"], (3, 3, None, (HostSlots("a", 2), HostSlots("b", 2)))),
        (["-H", "a:2,b:2", "--min-np", "2"], (2, 2, None, (HostSlots("a", 2), HostSlots("b", 2)))),
        (
            ["-H", "a:2,b:2", "--min-np", "1", "-np", "3", "--max-np", "3"],
            (3, 1, 3, (HostSlots("a", 2), HostSlots("b", 2))),
        ),
        (
            ["-H", "a,b", "--slots-per-host", "4"],
            (8, 8, None, (HostSlots("a", 4), HostSlots("b", 4))),
        ),
        (["--hosts", "a:1"], (1, 1, None, (HostSlots("a", 1),))),
        (["-H", "[::1]:2,10.0.0.1"], (3, 3, None, (HostSlots("::1", 2), HostSlots("10.0.0.1", 1)))),
    ],
)
def test_worker_counts_resolve(argv, expected):
    config = parse(*argv, *CMD)
    assert (config.np, config.min_np, config.max_np, config.hosts) == expected


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["-np", "2"], (2, 2, None)),
        (["--min-np", "2"], (2, 2, None)),
        (["--min-np", "2", "--max-np", "6"], (2, 2, 6)),
        (["-np", "4", "--min-np", "2", "--max-np", "6"], (4, 2, 6)),
    ],
)
def test_worker_counts_with_discovery(script, argv, expected):
    config = parse("--host-discovery-script", script, *argv, *CMD)
    assert (config.np, config.min_np, config.max_np) == expected
    assert config.hosts == ()


def test_discovery_script_path_is_made_absolute(script, monkeypatch):
    monkeypatch.chdir(os.path.dirname(script))
    config = parse("--host-discovery-script", "./discover.sh", "-np", "1", *CMD)
    assert config.discovery_script == script


# ----------------------------------------------------------------------------- the command


@pytest.mark.parametrize(
    "argv, command",
    [
        (["-np", "2", "python", "t.py"], ("python", "t.py")),
        # everything after COMMAND belongs to it, even our own flags
        (
            ["-np", "2", "python", "t.py", "-np", "5", "-v", "--", "x"],
            ("python", "t.py", "-np", "5", "-v", "--", "x"),
        ),
        (["-np", "2", "--", "python", "-u"], ("python", "-u")),
        (["-np", "2", "--", "-weird-program"], ("-weird-program",)),
        (["-np", "2", "--", "--", "x"], ("--", "x")),
        (["-np=2", "./run"], ("./run",)),
    ],
)
def test_command_is_the_remainder(argv, command):
    assert parse(*argv).command == command


# ----------------------------------------------------------------------------- bad use


@pytest.mark.parametrize(
    "argv, flag, problem",
    [
        (["-np", "2"], "COMMAND", "no COMMAND"),
        (["-np", "2", "--"], "COMMAND", "no COMMAND"),
        ([*CMD], "-np", "required"),
        (["--min-np", "2", *CMD], "-np", "required"),
        (["-np", "0", *CMD], "-np", ">= 1"),
        (["-np", "two", *CMD], "-np", "whole number"),
        (["-np", "1.5", *CMD], "-np", "whole number"),
        (["-np", "-1", *CMD], "-np", ">= 1"),
        (["-np", "2", "--min-np", "0", *CMD], "--min-np", ">= 1"),
        (["-np", "2", "--max-np", "0", *CMD], "--max-np", ">= 1"),
        (["-H", "a:4", "--min-np", "3", "--max-np", "2", *CMD], "--min-np", "above --max-np"),
        (["-np", "3", "--max-np", "2", *CMD], "-np", "above --max-np"),
        (["-H", "a:4", "-np", "3", "--max-np", "2", *CMD], "-np", "above --max-np"),
        (["-np", "2", "--min-np", "3", *CMD], "-np", "below --min-np"),
        (["-H", "a:2", "-np", "3", *CMD], "-H", "fewer than -np"),
        (["-H", "a:1,b:1", "--min-np", "3", *CMD], "-H", "fewer than -np"),
        (["-H", "a:x", *CMD], "-H", "bad slots"),
        (["-H", "a:0", *CMD], "-H", "bad slots"),
        (["-H", "a:", *CMD], "-H", "bad slots"),
        (["-H", ":2", *CMD], "-H", "empty host"),
        (["-H", "a,,b", *CMD], "-H", "empty host"),
        (["-H", "", *CMD], "-H", "empty host"),
        (["-H", "a b", *CMD], "-H", "bad host name"),
        (["--hosts=-oProxyCommand=x", *CMD], "-H", "bad host name"),
        (["-H", "a:1,a:2", *CMD], "-H", "listed twice"),
        (["-H", "[::1", *CMD], "-H", "missing ']'"),
        (["-np", "1", "--slots-per-host", "0", *CMD], "--slots-per-host", ">= 1"),
        (["-np", "1", "--discovery-interval", "0", *CMD], "--discovery-interval", "> 0"),
        (["-np", "1", "--discovery-interval", "nan", *CMD], "--discovery-interval", "> 0"),
        (["-np", "1", "--discovery-interval", "inf", *CMD], "--discovery-interval", "> 0"),
        (["-np", "1", "--elastic-timeout", "-1", *CMD], "--elastic-timeout", "> 0"),
        (["-np", "1", "--elastic-timeout", "0", *CMD], "--elastic-timeout", "> 0"),
        (["-np", "1", "--start-timeout", "0", *CMD], "--start-timeout", "> 0"),
        (["-np", "1", "--start-timeout", "soon", *CMD], "--start-timeout", "> 0"),
        (["-np", "1", "--ps-checkpoint-interval", "0", *CMD], "--ps-checkpoint-interval", "> 0"),
        (["-np", "1", "--chaos-kill-interval", "0", *CMD], "--chaos-kill-interval", "> 0"),
        (
            ["-np", "1", "--chaos-max-kills", "-1", "--chaos-kill-interval", "1", *CMD],
            "--chaos-max-kills",
            ">= 0",
        ),
        (
            ["-np", "1", "--chaos-max-kills", "2", *CMD],
            "--chaos-max-kills",
            "needs --chaos-kill-interval",
        ),
        (["-np", "1", "--reset-limit", "-1", *CMD], "--reset-limit", ">= 0"),
        (["-np", "1", "--num-ps", "-1", *CMD], "--num-ps", ">= 0"),
        (["-np", "1", "--ps-mode", "bulk", *CMD], "--ps-mode", "invalid choice"),
        (["-np", "1", "--num-ps", "1", "--ps-replicas", "2", *CMD], "--ps-replicas", "at most 1"),
        (["-np", "1", "--num-ps", "1", "--ps-replicas", "-1", *CMD], "--ps-replicas", "0 or 1"),
        (["-np", "1", "--launcher", "mpi", *CMD], "--launcher", "invalid choice"),
        (
            ["-np", "1", "--blacklist-cooldown-range", "300", "10", *CMD],
            "--blacklist-cooldown-range",
            "MIN 300 is above MAX 10",
        ),
        (
            ["-np", "1", "--blacklist-cooldown-range", "-1", "10", *CMD],
            "--blacklist-cooldown-range",
            ">= 0",
        ),
        (
            ["-np", "1", "--blacklist-cooldown-range", "10", "--", *CMD],
            "--blacklist-cooldown-range",
            "2 arguments",
        ),
        (["-np", "1", "--rendezvous", "redis://h:1", *CMD], "--rendezvous", "bad store URL"),
        (["-np", "1", "--rendezvous", "etcd://", *CMD], "--rendezvous", "empty endpoint"),
        (["-np", "1", "--rendezvous", "etcd://h", *CMD], "--rendezvous", "HOST:PORT"),
        (["-np", "1", "--rendezvous", "etcd://h:0", *CMD], "--rendezvous", "bad port"),
        (["-np", "1", "--rendezvous", "etcd://h:65536", *CMD], "--rendezvous", "bad port"),
        (["-np", "1", "--rendezvous", "etcd://h:x", *CMD], "--rendezvous", "bad port"),
        (["-np", "1", "--rendezvous", "etcd://h:1,", *CMD], "--rendezvous", "empty endpoint"),
        (["-np", "1", "--rendezvous", "etcd://h:²", *CMD], "--rendezvous", "²"),
        (["-np", "1", "--rendezvous", "", *CMD], "--rendezvous", "empty store URL"),
        (
            ["-np", "1", "--rendezvous", "embedded://127.0.0.1:5000", *CMD],
            "--rendezvous",
            "use 'embedded'",
        ),
        (["-np", "1", "--job-id", "a/b", *CMD], "--job-id", "letters"),
        (["-np", "1", "--job-id", "", *CMD], "--job-id", "letters"),
        (["-np", "1", "--job-id=-x", *CMD], "--job-id", "letters"),
        (["-np", "1", "--job-id", "x" * 129, *CMD], "--job-id", "letters"),
        (["-np", "1", "--bogus", *CMD], "--bogus", "unrecognized"),
        # abbreviations are refused: "--min" must not mean "--min-np"
        (["-np", "1", "--min", "1", *CMD], "--min", "unrecognized"),
        (["-np", *CMD], "-np", "whole number"),
        # absurd sizes: bounded, one line, without converting a thousand digits
        (["-np", "99999999999999999999", *CMD], "-np", "at most 4096"),
        (["-np", "9" * 5000, *CMD], "-np", "at most 4096"),
        (["-H", "a:2", "--max-np", "4097", *CMD], "--max-np", "at most 4096"),
        (["-H", "a:2", "--min-np", "10000", *CMD], "--min-np", "at most 4096"),
        (["-np", "2000", *CMD], "-np", "at most 1024 slots"),
        (["-np", "1", "--slots-per-host", "5000", *CMD], "--slots-per-host", "at most 1024"),
        (["-H", "a:99999999999999999999999", *CMD], "-H", "at most 1024 per host"),
        (["-H", ",".join(f"h{i}:1024" for i in range(65)), *CMD], "-H", "at most 65536"),
        (["-H", "x" * 300, *CMD], "-H", "DNS allows 253"),
        (["-np", "2", "--spares", "-1", *CMD], "--spares", ">= 0"),
        (["-np", "2", "--spares", "one", *CMD], "--spares", "whole number"),
        (["-np", "2", "--spares", "5000", *CMD], "--spares", "at most 1024"),
    ],
)
def test_bad_use_is_a_one_line_usage_error(argv, flag, problem):
    with pytest.raises(UsageError) as caught:
        parse(*argv)
    message = str(caught.value)
    assert flag in message and problem in message
    assert "\n" not in message


def test_hosts_and_script_are_exclusive(script):
    with pytest.raises(UsageError, match=r"--host-discovery-script.*-H"):
        parse("-H", "a:1", "--host-discovery-script", script, *CMD)


def test_discovery_needs_a_size(script):
    with pytest.raises(UsageError, match=r"--host-discovery-script needs -np or --min-np"):
        parse("--host-discovery-script", script, *CMD)


def test_discovery_script_missing(tmp_path):
    missing = str(tmp_path / "nope.sh")
    with pytest.raises(UsageError, match=r"--host-discovery-script .*nope.sh: no such file"):
        parse("--host-discovery-script", missing, "-np", "1", *CMD)


def test_discovery_script_not_executable(tmp_path):
    path = tmp_path / "plain.sh"
    path.write_text("#!/bin/sh\necho a\n")
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(UsageError, match=r"--host-discovery-script .*plain.sh: not executable"):
        parse("--host-discovery-script", str(path), "-np", "1", *CMD)


def test_discovery_script_is_a_directory(tmp_path):
    with pytest.raises(UsageError, match=r"--host-discovery-script .*: not a file"):
        parse("--host-discovery-script", str(tmp_path), "-np", "1", *CMD)


def test_usage_error_is_an_elastic_error():
    assert issubclass(UsageError, DriverError) and issubclass(DriverError, ElasticError)
    assert UsageError.__doc__ and DriverError.__doc__


# ----------------------------------------------------------------------------- rendezvous URL


@pytest.mark.parametrize(
    "text, url",
    [
        ("embedded", StoreURL("embedded", ())),
        ("etcd://10.0.0.5:2379", StoreURL("etcd", (Endpoint("10.0.0.5", 2379),))),
        ("etcd://a:1, b:2", StoreURL("etcd", (Endpoint("a", 1), Endpoint("b", 2)))),
        (
            "etcd://[::1]:2379,[fd00::2]:2380",
            StoreURL("etcd", (Endpoint("::1", 2379), Endpoint("fd00::2", 2380))),
        ),
    ],
)
def test_rendezvous_urls(text, url):
    assert parse("-np", "1", "--rendezvous", text, *CMD).rendezvous == url


# ----------------------------------------------------------------------------- help


def test_help_explains_every_flag(capsys):
    parser = build_parser()
    flags = [opt for action in parser._actions for opt in action.option_strings]
    for flag in [
        "-np",
        "--min-np",
        "--max-np",
        "--spares",
        "-H",
        "--host-discovery-script",
        "--slots-per-host",
        "--discovery-interval",
        "--rendezvous",
        "--job-id",
        "--reset-limit",
        "--blacklist-cooldown-range",
        "--elastic-timeout",
        "--start-timeout",
        "--launcher",
        "--num-ps",
        "--ps-mode",
        "--ps-checkpoint-dir",
        "--ps-checkpoint-interval",
        "--ps-replicas",
        "--chaos-kill-interval",
        "--chaos-max-kills",
        "--log-dir",
        "--events",
        "-v",
    ]:
        assert flag in flags, flag
    for action in parser._actions:
        assert action.help, action.option_strings or action.dest
    with pytest.raises(SystemExit) as exited:
        parse_args(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "elastic-run" in text and "etcd://HOST:PORT" in text and "examples:" in text


# ------------------------------------------------------------------ horovodrun's flags


def test_a_horovodrun_elastic_command_line_parses_with_horovodrun_replaced(tmp_path):
    """The elastic flags of horovodrun mean the same here, under its names too."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:4\n")
    script.chmod(0o755)
    config = parse_args(
        [
            *("--num-proc", "2", "--min-num-proc", "1", "--max-num-proc", "4"),
            *("--host-discovery-script", str(script), "--slots-per-host", "2"),
            *("--reset-limit", "3", "--blacklist-cooldown-range", "10", "100"),
            *("--elastic-timeout", "60", "--network-interfaces", "lo", "--verbose"),
            *("python", "train.py", "--epochs", "3"),
        ]
    )
    assert (config.np, config.min_np, config.max_np) == (2, 1, 4)
    assert (config.reset_limit, config.blacklist_cooldown_range) == (3, (10, 100))
    assert (config.elastic_timeout, config.network_interface, config.verbosity) == (60, "lo", 1)
    assert config.command == ("python", "train.py", "--epochs", "3")


@pytest.mark.parametrize("flags", sorted(REFUSED), ids=lambda flags: flags[-1])
def test_each_horovodrun_flag_we_lack_is_one_line_saying_what_to_do(flags):
    values, hint = REFUSED[flags]
    for flag in flags:
        with pytest.raises(UsageError) as caught:
            parse_args(["-np", "2", flag, *(["x"] * values), "python", "train.py"])
        assert str(caught.value) == f"{flag} is horovodrun's, elastic-run has no such flag: {hint}"


def test_several_network_interfaces_are_refused_naming_the_flag():
    with pytest.raises(UsageError, match="--network-interfaces: 'eth0,eth1'"):
        parse_args(["-np", "2", "--network-interfaces", "eth0,eth1", "true"])


def test_restart_workers_is_a_mode_of_the_job_with_the_usual_flags():
    config = parse("--restart-workers", "-np", "4", "-H", "a:2,b:2", "--reset-limit", "3", *CMD)
    assert config.restart_workers and config.reset_limit == 3 and config.np == 4
    assert not parse("-np", "2", *CMD).restart_workers
    assert "--restart-workers" in build_parser().format_help()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--num-ps", "1"), "--num-ps"),
        (("--checkpoint-dir", "/tmp/x"), "--checkpoint-dir"),
        (("--on-state-lost", "restart"), "--on-state-lost restart"),
    ],
)
def test_restart_workers_refuses_what_only_elastic_workers_can_do(flags, named):
    with pytest.raises(UsageError, match=f"^{named} does not go with --restart-workers: "):
        parse("--restart-workers", "-np", "2", *flags, *CMD)


def test_restart_workers_takes_spares_for_a_python_program_only():
    """A spare of restart mode imports the program ahead of need: it must be one."""
    for command in (
        CMD,
        ["python3", "-m", "pkg.train", "--lr", "1"],
        ["/usr/bin/python3.11", "t.py"],
    ):
        assert parse("--restart-workers", "-np", "2", "--spares", "2", *command).spares == 2
    for command in (["./train.sh"], ["python", "-u", "t.py"], ["python", "-c", "pass"]):
        with pytest.raises(UsageError, match=r"^--spares does not go with --restart-workers: "):
            parse("--restart-workers", "-np", "2", "--spares", "1", *command)


def test_restart_workers_ignores_a_checkpoint_dir_in_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTIC_CHECKPOINT_DIR", str(tmp_path / "snaps"))
    config = parse("--restart-workers", "-np", "2", *CMD)
    assert config.checkpoint_dir is None and not (tmp_path / "snaps").exists()
