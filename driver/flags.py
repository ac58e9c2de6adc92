"""``elastic-run``'s flags: the argparse parser, its help text, and the defaults it names.

``build_parser`` declares every flag with its type (a converter that checks the bounds
and names the flag in its message), its default and its ``--help`` line; argparse's
own errors become ``UsageError`` (the parser and the converters:
``driver.flag_types``; the help's prose around the flags: ``driver.flag_help``). It is apart from ``driver.config`` (which turns the
parsed flags into a validated ``JobConfig``: the size, host and path rules) because the
two change for different reasons: the help is the user's text, the rules are the job's
contract; and the help alone is longer than the rules.
"""

from __future__ import annotations

import argparse

from driver import flag_help as help_text
from driver import flag_types as types
from driver.horovodrun_flags import add_horovodrun_flags
from driver.hosts.discovery import DEFAULT_SCRIPT_TIMEOUT
from driver.hosts.manager import BlacklistPolicy
from driver.hosts.shard_placement import PLACEMENTS
from driver.hosts.slots import MAX_WORKERS
from driver.launch.registry import launcher_names
from rendezvous import env
from rendezvous.version import package_version

DEFAULT_SLOTS_PER_HOST = 1
DEFAULT_DISCOVERY_INTERVAL = 1.0
DEFAULT_RENDEZVOUS = "embedded"
DEFAULT_BLACKLIST_COOLDOWN_RANGE = (10.0, 300.0)
DEFAULT_ELASTIC_TIMEOUT = 600.0
DEFAULT_START_TIMEOUT = 120.0
DEFAULT_PS_MODE = "async"
DEFAULT_PS_CHECKPOINT_INTERVAL = 60.0
DEFAULT_PROGRESS_INTERVAL = 10.0
DEFAULT_DRIVER_TIMEOUT = 300.0
#: seconds the last holders of the state (every member's host dropped at once: a world
#: replaced whole) wait for newcomers to take it (``driver.policy.departures``)
HANDOFF_WAIT = 60.0
PS_MODES = ("async", "sync")
STATE_LOST_ACTIONS = ("fail", "restart")


def build_parser() -> argparse.ArgumentParser:
    """The ``elastic-run`` argument parser. Its ``error`` raises ``UsageError``;
    ``--help`` prints the help and exits 0 (``SystemExit``), as argparse does."""
    p = types.RaisingParser(
        prog="elastic-run",
        description=help_text.DESCRIPTION,
        epilog=help_text.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # "--min" must not silently mean "--min-np"; and abbreviations
        # would make a user's future flag typo land on ours.
        allow_abbrev=False,
    )

    size = p.add_argument_group("job size")
    size.add_argument(
        "-np",
        "--num-proc",  # (horovodrun's name)
        dest="np",
        type=types.worker_count,
        metavar="N",
        help="workers to start with. Without hosts: the job runs N workers on "
        "localhost, replacing any that fail (a static-size job). With hosts: "
        "how many workers must be up before training starts (default: "
        f"--min-np, or all slots of -H; at most {MAX_WORKERS})",
    )
    size.add_argument(
        "--min-np",
        "--min-num-proc",
        type=types.worker_count,
        metavar="N",
        help="fewest workers to train with; below it the job waits for hosts, up "
        "to --elastic-timeout (default: -np)",
    )
    size.add_argument(
        "--max-np",
        "--max-num-proc",
        type=types.worker_count,
        metavar="N",
        help="most workers at once (default: -np without hosts; with hosts no "
        "limit beyond the slots)",
    )
    size.add_argument(
        "--spares",
        type=types.spare_count,
        default=0,
        metavar="N",
        help="warm spare workers to keep on each host (without hosts: on localhost, "
        "for the job): each runs COMMAND up to elastic.init(), registers and waits, "
        "in no round and on no slot. A failed worker's slot, or a slot added by "
        "discovery, goes to a spare of that host at once instead of a fresh "
        "process, and a new spare starts behind it. With --restart-workers, each "
        "imports what the Python program (python SCRIPT, python -m MODULE) imports "
        "and waits, and a new world's worker on its host is a spare instead of a "
        "fresh process. Costs one idle process (its memory) per spare (default: 0)",
    )

    hosts = p.add_argument_group("hosts")
    where = hosts.add_mutually_exclusive_group()
    where.add_argument(
        "-H",
        "--hosts",
        dest="hosts",
        metavar="HOST[:SLOTS],...",
        help="fixed host list, e.g. node1:4,node2:4; a HOST without :SLOTS gets "
        "--slots-per-host; IPv6 with slots as [addr]:SLOTS (default: localhost "
        "with -np slots)",
    )
    where.add_argument(
        "--host-discovery-script",
        metavar="PATH",
        help="executable run every --discovery-interval; prints one HOST or "
        "HOST:SLOTS per line (blank lines and # comments ignored, a host "
        "listed twice is an error). Hosts it stops listing are removed: their "
        "workers leave at their next commit; when it drops every host of the round at "
        f"once, they stay until the newcomers hold the state (up to {HANDOFF_WAIT:g}s; "
        "then, with --checkpoint-dir, after a snapshot of it)",
    )
    hosts.add_argument(
        "--slots-per-host",
        type=types.slot_count,
        default=None,
        metavar="N",
        help=f"slots of a host listed without :SLOTS (default: {DEFAULT_SLOTS_PER_HOST}); "
        "with --join, the slots this node offers (default under Slurm: the GPUs Slurm gave "
        "the node, else the tasks of this step on it, of which the first joins)",
    )
    hosts.add_argument(
        "--discovery-interval",
        type=types.positive_seconds,
        default=DEFAULT_DISCOVERY_INTERVAL,
        metavar="SEC",
        help="seconds between runs of the discovery script (default: %(default)s)",
    )
    hosts.add_argument(
        "--discovery-timeout",
        type=types.positive_seconds,
        default=DEFAULT_SCRIPT_TIMEOUT,
        metavar="SEC",
        help="a run of the discovery script (or of Slurm's squeue/sinfo with --launcher "
        "slurm) that takes longer is killed with its process group and counts as a failed "
        "discovery; the hosts found before stay meanwhile (default: %(default)s)",
    )
    hosts.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="the hosts are the alive nodes of the Ray cluster at ADDRESS (HOST:PORT of its "
        "head, or 'auto' on one of its nodes; needs the 'ray' extra; run it on a node of "
        "the cluster): each host's agent runs on its node through an actor pinned there, "
        "its slots --slots-per-host, else the node's GPUs, else 1",
    )
    hosts.add_argument(
        "--blacklist-cooldown-range",
        type=types.non_negative_seconds,
        nargs=2,
        default=DEFAULT_BLACKLIST_COOLDOWN_RANGE,
        metavar=("MIN", "MAX"),
        help="a host whose workers keep failing is left out for a cooldown that "
        "starts at MIN seconds and doubles with each blacklisting up to MAX "
        f"(default: {DEFAULT_BLACKLIST_COOLDOWN_RANGE[0]:g} "
        f"{DEFAULT_BLACKLIST_COOLDOWN_RANGE[1]:g}). A host is left out when "
        f"{BlacklistPolicy.failure_threshold} of its workers fail within "
        f"{BlacklistPolicy.failure_window:g} s, but never if that would leave "
        f"fewer than --min-np slots",
    )

    store = p.add_argument_group("rendezvous")
    store.add_argument(
        "--rendezvous",
        default=DEFAULT_RENDEZVOUS,
        metavar="URL",
        help="'embedded' (the driver runs the store), etcd://HOST:PORT[,HOST:PORT...], or "
        "etcds://HOST:PORT[,HOST:PORT...]: etcd over TLS, for every process of the job, "
        "trusting --etcd-ca-cert, else the CAs this machine trusts (etcd:// with a CA or "
        "client certificate given is TLS too) (default: %(default)s)",
    )
    # etcd's own security: each flag sets its ELASTIC_ETCD_* variable for every process
    # of the job (driver.etcd_security); the password has no flag, on purpose.
    store.add_argument(
        "--etcd-ca-cert",
        metavar="PATH",
        help="(etcd) the CA certificate etcd's certificate is checked against; TLS to etcd. "
        "Every process of the job reads PATH, on its own host: give each host the file "
        "there (default: $ELASTIC_ETCD_CA_CERT; with etcds:// and neither, the CAs this "
        "machine trusts)",
    )
    store.add_argument(
        "--etcd-cert",
        metavar="PATH",
        help="(etcd) the client certificate shown to an etcd that asks for one "
        "(--client-cert-auth); needs --etcd-key; TLS to etcd; on every host, as "
        "--etcd-ca-cert (default: $ELASTIC_ETCD_CERT)",
    )
    store.add_argument(
        "--etcd-key",
        metavar="PATH",
        help="(etcd) the private key of --etcd-cert (default: $ELASTIC_ETCD_KEY)",
    )
    store.add_argument(
        "--etcd-user",
        metavar="NAME",
        help="(etcd) the etcd user every process of the job authenticates as (etcd's auth "
        "enabled). Its password is read from ELASTIC_ETCD_PASSWORD only, never from a flag: "
        "a command line is visible to every user of the machine (default: "
        "$ELASTIC_ETCD_USER)",
    )
    store.add_argument(
        "--job-id",
        metavar="ID",
        help="names the job's keys in the store; letters, digits, '_', '.', '-'; "
        "an id a live driver leads is refused; with etcd, an id whose workers run "
        "without a live driver is adopted: this driver leads them (default: a fresh "
        "random id)",
    )
    store.add_argument(
        "--standby",
        action="store_true",
        help="(etcd, with --job-id) while another driver leads the job, wait as its "
        "standby and take the job over when that driver is gone (its workers keep "
        "running); with no leader, lead at once. With the embedded store the driver is "
        "the store: its death ends the job, so long jobs should use etcd",
    )

    join = p.add_argument_group("join mode (the same command on every node, no ssh)")
    join.add_argument(
        "--join",
        action="store_true",
        help="make this node a host of job --job-id: run its agent and workers here; the "
        "first node leads, the others stand by and take over. Hosts are the live joined "
        "nodes, and those of -H or --host-discovery-script where given (their agents "
        "started by ssh, as without --join). The store: --rendezvous etcd://... (or "
        "etcds://...), or embedded://NODE:PORT, served by the node named NODE (the job then lasts as long as that node: etcd for anything "
        "long). Needs the job's secret: ELASTIC_JOB_SECRET or --job-secret-file, the same "
        "on every node",
    )
    join.add_argument(
        "--host-name",
        metavar="NAME",
        help="this node's name in the job (default: SLURMD_NODENAME, else the hostname); "
        "--job-id defaults to SLURM_JOB_ID",
    )
    join.add_argument("--job-secret-file", metavar="PATH", help="read the job's secret here")
    join.add_argument(
        "--new-job",
        action="store_true",
        help="start job --job-id over when it has ended (its training finished, or it "
        "failed): a new job under the same id, from the script's start or from "
        "--checkpoint-dir's newest snapshot. Without it a node that joins an ended job is "
        "refused (exit 2), naming how and when the job ended, so that a late node does not "
        "train it again from scratch. A job stopped by a signal is resumed either way",
    )
    store.add_argument(
        "--network-interface",
        metavar="NAME",
        help="advertise this interface's address to the other hosts (default: the "
        "address of the route toward the hosts; loopback for a one-machine job)",
    )
    store.add_argument(
        "--driver-address",
        metavar="ADDR",
        help="advertise ADDR to the other hosts for the driver's servers (the embedded "
        "store); wins over --network-interface",
    )

    fault = p.add_argument_group("fault tolerance")
    fault.add_argument(
        "--reset-limit",
        type=types.non_negative_int,
        metavar="N",
        help="fail the job when more than N rounds follow the first (each worker "
        "failure or host change makes a new round); with --restart-workers, when more "
        "than N worlds start after a failure (default: unlimited)",
    )
    fault.add_argument(
        "--restart-workers",
        action="store_true",
        help="run a torchrun script unchanged: start every worker of a world with the "
        "variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
        "GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, ...), and "
        "when a worker fails or is lost, or the hosts change, stop every worker "
        "(SIGTERM, SIGKILL after 5 s) and start the whole world again over the hosts "
        "usable then, with new ranks; the script resumes from its own checkpoints. "
        "--reset-limit bounds the restarts after failures (torchrun's --max-restarts); "
        "not with --spares, --num-ps or --checkpoint-dir",
    )
    fault.add_argument(
        "--elastic-timeout",
        type=types.positive_seconds,
        default=DEFAULT_ELASTIC_TIMEOUT,
        metavar="SEC",
        help="fail the job after waiting this long for --min-np "
        "workers once training started, or for a rendezvous store that does not "
        "answer (the workers train on meanwhile; with --checkpoint-dir rank 0 keeps "
        "snapshotting alone, so the job ends with a snapshot at most "
        "--checkpoint-interval old) (default: %(default)s)",
    )
    fault.add_argument(
        "--driver-timeout",
        type=types.positive_seconds,
        default=DEFAULT_DRIVER_TIMEOUT,
        metavar="SEC",
        help="with an etcd store the job outlives its driver: each host's agent keeps "
        "its workers training this long with no driver, then stops them cleanly and "
        "exits (with the embedded store the driver is the store: its death ends the "
        "job) (default: %(default)s)",
    )
    fault.add_argument(
        "--start-timeout",
        type=types.positive_seconds,
        default=DEFAULT_START_TIMEOUT,
        metavar="SEC",
        help="fail the job if -np workers have not registered this "
        "long after start (default: %(default)s)",
    )
    fault.add_argument(
        "--hang-timeout",
        type=types.non_negative_seconds,
        metavar="SEC",
        help="a worker whose process lives but whose training function (@elastic.run) "
        "reaches no collective or commit for SEC seconds is hung: every thread's "
        "Python stack of it goes to this log, a 'hung' event is said, and it is killed "
        "and replaced like any lost worker; 0 turns it off (default: adapts, "
        f"{env.HANG_FACTOR:g} times the job's median step, never below "
        f"{env.HANG_FLOOR:g} s, which covers a first step's compile or load). "
        "SIGUSR1 to elastic-run prints every worker's stacks on this machine to "
        "stderr, changing nothing",
    )
    fault.add_argument(
        "--launcher",
        choices=launcher_names(),
        default=launcher_names()[0],
        help="how workers start: 'local' runs every worker on this machine "
        "whatever its host name (handy to simulate hosts: the names are labels that "
        "need not resolve, and every process talks over loopback), 'ssh' runs "
        "'ssh HOST' for every host, 'auto' uses local for this machine and "
        "ssh for the others, 'slurm' (inside an sbatch/salloc allocation) starts each "
        "host's agent as a one-task step with 'srun --overlap --no-kill -w HOST' and, "
        "without -H or a discovery script, takes the allocation's nodes as the hosts "
        "(their slots: --slots-per-host, else the GPUs or tasks per node Slurm gave; "
        "nodes Slurm marks DOWN or DRAIN leave the job) (default: %(default)s)",
    )

    ps = p.add_argument_group("parameter servers")
    ps.add_argument(
        "--num-ps",
        type=types.non_negative_int,
        default=0,
        metavar="N",
        help="parameter-server shards to run (default: %(default)s, none)",
    )
    # The ones below default to None so that giving one without --num-ps is an error
    # (it would do nothing); parse_args fills in the defaults the help names.
    ps.add_argument(
        "--ps-mode",
        choices=PS_MODES,
        help="async: apply each push on arrival; sync: apply step s once every "
        f"worker of the round pushed it; needs --num-ps (default: {DEFAULT_PS_MODE})",
    )
    ps.add_argument(
        "--ps-checkpoint-dir",
        metavar="DIR",
        help="where shards write checkpoints and restart from; needs --num-ps "
        "(default: none, so a restarted shard starts empty)",
    )
    ps.add_argument(
        "--ps-checkpoint-interval",
        type=types.positive_seconds,
        metavar="SEC",
        help="seconds between checkpoints; needs --num-ps, and is ignored without "
        f"--ps-checkpoint-dir (default: {DEFAULT_PS_CHECKPOINT_INTERVAL:g})",
    )
    ps.add_argument(
        "--ps-placement",
        choices=PLACEMENTS,
        help="where the shards run: 'driver' (this machine) or 'spread' (shard I on the "
        "I-th host, round robin; a shard whose host is lost restarts on another host "
        "from the newest checkpoint, so --ps-checkpoint-dir must be shared by the "
        "hosts); needs --num-ps (default: driver)",
    )
    ps.add_argument(
        "--ps-replicas",
        type=types.ps_replicas,
        metavar="N",
        help="1: run a backup process for each shard (on another host than the shard "
        "when --ps-placement spread has one) that holds every update before the shard "
        "acknowledges it; a shard that dies fails over to its backup at once, with no "
        "step lost and no rollback, and a new backup is started. 0: a dead shard "
        "restarts from the newest checkpoint, and the steps after it are lost (the "
        "driver says how many); needs --num-ps (default: 0)",
    )

    state = p.add_argument_group("training state")
    state.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="write snapshots of the workers' committed state (every State: numpy, "
        "objects, torch, the samplers' progress) to DIR every --checkpoint-interval, "
        "from a committed copy, off the training path, each worker writing a part; "
        "keeps the newest 3 (on a full disk the oldest make room, never the newest). A "
        "job started (again) with a DIR that holds one resumes from the newest. DIR "
        "must be this user's own, not writable by others. One job per DIR: the driver "
        "records its job there; another job on a DIR in use is refused, a job without "
        "--job-id is its DIR's job, and another job's snapshots are never loaded nor "
        "deleted, nor one of another state (its arrays' shapes) loaded. On storage "
        "every host sees, or host-local: each host then keeps its own copy (default: "
        "$ELASTIC_CHECKPOINT_DIR, else none)",
    )
    state.add_argument(
        "--checkpoint-interval",
        type=types.positive_seconds,
        metavar="SEC",
        help="seconds between two snapshots: at most this much training is lost when "
        "every worker is; needs --checkpoint-dir (default: "
        f"$ELASTIC_CHECKPOINT_INTERVAL, else {env.DEFAULT_CHECKPOINT_INTERVAL:g})",
    )
    state.add_argument(
        "--on-state-lost",
        choices=STATE_LOST_ACTIONS,
        default=STATE_LOST_ACTIONS[0],
        help="when no worker holding the committed state survived and no snapshot "
        "holds it: 'fail' ends the job, naming the last committed step lost; "
        "'restart' starts over from the script's initial state (as torchrun does) and "
        "says so (default: %(default)s)",
    )

    chaos = p.add_argument_group("chaos testing")
    chaos.add_argument(
        "--chaos-kill-interval",
        type=types.positive_seconds,
        metavar="SEC",
        help="SIGKILL a random worker every SEC seconds (default: off)",
    )
    chaos.add_argument(
        "--chaos-max-kills",
        type=types.non_negative_int,
        metavar="N",
        help="stop the chaos after N kills; needs --chaos-kill-interval (default: unlimited)",
    )
    chaos.add_argument(
        "--chaos-below-min-np",
        action="store_true",
        help="let the chaos kill a member even when the round would fall below "
        "--min-np (default: it never does: a world below --min-np is one you did not "
        "declare survivable); needs --chaos-kill-interval",
    )

    out = p.add_argument_group("output")
    out.add_argument(
        "--log-dir",
        metavar="DIR",
        help="also write each worker's output to a file in DIR (default: none)",
    )
    out.add_argument(
        "--events",
        dest="events_file",
        metavar="FILE",
        help="append one JSON line per event (rounds, worker and host changes, "
        "progress) to FILE; each run's lines begin with its job_started "
        "(default: none)",
    )
    out.add_argument(
        "--progress-interval",
        type=types.non_negative_seconds,
        default=DEFAULT_PROGRESS_INTERVAL,
        metavar="SEC",
        help="at the first commit and then every SEC seconds, a line (and a "
        "'progress' event) with the round, its world size, the committed steps and "
        "steps/s over the last SEC seconds, for workers that commit a State; rank 0 "
        "writes its step to the store every SEC seconds or every second, whichever "
        "is sooner; 0 turns it off (default: %(default)g)",
    )
    out.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print the version and exit",
    )
    out.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="count",
        default=0,
        help="more driver output on stderr; repeat for more",
    )

    add_horovodrun_flags(p)  # a horovodrun command line works, or says what to change
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND [ARG...]",
        help="the worker program and its arguments; everything from COMMAND on "
        "belongs to it (put -- before it if it starts with '-')",
    )
    return p
