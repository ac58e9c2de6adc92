"""The key layout of one job in the store (every part of the product names keys through here)."""

from __future__ import annotations

from dataclasses import dataclass

ROOT = "/elastic"
ENDED_ROOT = "/elastic-ended"
"""Where the outcome of a joined job that ended stays (``JobKeys.outcome``): beside the
jobs' prefixes, not under one (a job id cannot hold '/', so ``/elastic-ended/<job>``
is no job's key), since the job's own keys are deleted at its end."""


@dataclass(frozen=True)
class JobKeys:
    """Keys of the job ``job_id``; prefixes end with '/' so a prefix never matches a sibling."""

    job_id: str

    @property
    def prefix(self) -> str:
        return f"{ROOT}/{self.job_id}/"

    @property
    def driver(self) -> str:
        """The driver that leads the job (JSON of ``rendezvous.schema.leader.DriverRecord``),
        written under the driver's own lease: while it exists, the job id is taken."""
        return f"{self.prefix}driver"

    @property
    def term(self) -> str:
        """The newest leader term (a decimal number, no lease): it outlives the leader
        record, so a successor takes the next term even after the leader's key lapsed.
        Written with the leader record, in the transaction that takes the lead."""
        return f"{self.prefix}term"

    @property
    def leader_beat(self) -> str:
        """A counter the leader rewrites every fraction of a second under its lease: a
        standby that sees it stop takes the silent leader's lease away instead of
        waiting for it to lapse (etcd's shortest lease is seconds)."""
        return f"{self.prefix}leader-beat"

    @property
    def driver_state(self) -> str:
        """What a successor needs of the leader's policy state (JSON of
        ``rendezvous.schema.leader.DriverStateRecord``); written by the leader only, fenced. (Not
        under the leader key's name: agents watch that name as a prefix.)"""
        return f"{self.prefix}state"

    @property
    def round(self) -> str:
        """The current plan (JSON of ``rendezvous.schema.rounds.Plan``); written by the driver only."""
        return f"{self.prefix}round"

    @property
    def plan_head(self) -> str:
        """The current round's head (JSON of ``rendezvous.host_plan.RoundHead``: round,
        size, term, the plan's digest), written with ``round`` by the driver only: what
        workers and agents follow (``rendezvous.host_plan``)."""
        return f"{self.prefix}plan-head"

    @property
    def plan_hosts(self) -> str:
        """Prefix of the hosts' parts of the round (``rendezvous.host_plan.HostPart``)."""
        return f"{self.prefix}plan-hosts/"

    def plan_host_prefix(self, host: str) -> str:
        """Prefix of host ``host``'s parts: what its agent watches."""
        return f"{self.plan_hosts}{_label(host)}/"

    def plan_host(self, host: str, round_id: int) -> str:
        """Host ``host``'s part of round ``round_id`` (its members and their peers): one
        of two keys, by the round's parity, so that a round's part stays readable
        while the next round's parts are written, before its head."""
        return f"{self.plan_host_prefix(host)}{round_id % 2}"

    @property
    def workers(self) -> str:
        """Prefix of worker registrations, one key per worker under its lease."""
        return f"{self.prefix}workers/"

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}{worker_id}"

    @property
    def failures(self) -> str:
        """Prefix of failure reports: a worker that saw a peer's socket fail says so here."""
        return f"{self.prefix}failures/"

    def failure(self, round_id: int, reporter: str) -> str:
        return f"{self.failures}{round_id}/{reporter}"

    def silence(self, round_id: int, reporter: str, suspect: str) -> str:
        """A member of round ``round_id`` that ``reporter`` has not heard from for a while
        (a report apart from ``failure``: the collective may still go on)."""
        return f"{self.failures}{round_id}/{reporter}/silent/{suspect}"

    def hung(self, round_id: int, reporter: str) -> str:
        """Where worker ``reporter`` says that its own training is hung in ``round_id``
        (``--hang-timeout``: no collective for that long; its stacks in the record)."""
        return f"{self.failures}{round_id}/{reporter}/hung"

    @property
    def progress(self) -> str:
        """The job's newest committed step (JSON of ``rendezvous.schema.workers.ProgressRecord``),
        written by rank 0 every few seconds while it commits; the driver reports it."""
        return f"{self.prefix}progress"

    @property
    def ps(self) -> str:
        """Prefix of parameter-server shard addresses, one key per shard index."""
        return f"{self.prefix}ps/"

    def ps_shard(self, index: int) -> str:
        return f"{self.ps}{index:04d}"

    @property
    def ps_config(self) -> str:
        """The job's parameter-server settings (JSON of ``rendezvous.schema.ps.PSConfigRecord``),
        written by the driver before any worker starts: a ps client of a job without
        shards learns it at once instead of waiting for shards that never come."""
        return f"{self.prefix}ps-config"

    def finished(self, worker_id: str) -> str:
        """Written (without a lease) by a worker whose ``@elastic.run`` function returned:
        its training is complete (an exit 0 without it is a worker leaving early)."""
        return f"{self.prefix}finished/{worker_id}"

    @property
    def training_finished(self) -> str:
        """Written with the first ``finished/<id>``, in a transaction that holds only while
        the round key is still the finisher's round: the driver publishes a round only
        while this key does not exist. So either the finisher's round stays the last one,
        or the finisher sees the newer round and joins it (see ``elastic.loop``): a round
        of newcomers is never handed a training that ended without them."""
        return f"{self.prefix}training-finished"

    @property
    def ps_checkpoint(self) -> str:
        """The newest complete ps checkpoint (JSON of ``rendezvous.schema.ps.CheckpointRecord``);
        written by the coordinating shard, watched by the driver."""
        return f"{self.prefix}ps-checkpoint"

    @property
    def ps_checkpoint_failed(self) -> str:
        """The newest report of ps checkpoints that failed (JSON of
        ``rendezvous.schema.ps.CheckpointFailedRecord``): written by the coordinating shard
        (rate-limited while failures go on, and when a stop's final checkpoint cannot be
        written), watched by the driver, which says so."""
        return f"{self.prefix}ps-checkpoint-failed"

    # ---- durable snapshots of the workers' state (``elastic.snapshots``)
    @property
    def snapshot_at(self) -> str:
        """The next snapshot: the round and the commit every member writes its part of
        (JSON of ``rendezvous.schema.snapshots.SnapshotAt``); written by rank 0, watched by every
        member, so all of them snapshot the same commit without a collective."""
        return f"{self.prefix}snapshot-at"

    def snapshot_parts(self, group: str, step: int, token: str) -> str:
        """Prefix of the parts written of one snapshot (commit ``step``, attempt ``token``:
        a stop's snapshot of the commit a periodic one is writing is another attempt) by
        ``group`` (``all``, or a host's label when each host keeps its own copy): one
        ``SnapshotPart`` per writer; the part 0 writer waits for all, then deletes them."""
        return f"{self.prefix}snapshot-parts/{_label(group)}/{step:012d}/{_label(token)}/"

    def snapshot_part(self, group: str, step: int, token: str, part: int) -> str:
        return f"{self.snapshot_parts(group, step, token)}{part:05d}"

    @property
    def snapshots(self) -> str:
        """Prefix of what the snapshots say to the driver (``SnapshotRecord``s): the
        newest complete one of each group (``done/<group>``), a failed one
        (``failed/<group>``), and the one a round resumed from (``loaded/<round>``)."""
        return f"{self.prefix}snapshots/"

    def snapshot_done(self, group: str) -> str:
        return f"{self.snapshots}done/{_label(group)}"

    def snapshot_failed(self, group: str) -> str:
        return f"{self.snapshots}failed/{_label(group)}"

    def snapshot_loaded(self, round_id: int) -> str:
        return f"{self.snapshots}loaded/{round_id:012d}"

    @property
    def ps_records(self) -> str:
        """The prefix every ps key of the job shares (``ps/``, ``ps-config``,
        ``ps-checkpoint``, ``ps-checkpoint-failed``, ``ps-backup/``, ``ps-replica/``,
        ``ps-rollback``): one watch
        of it sees what the shards say in the order the store took it."""
        return f"{self.prefix}ps"

    @property
    def ps_backups(self) -> str:
        """Prefix of the ps shards' backups (``--ps-replicas 1``): each writes its
        ``rendezvous.schema.ps.ShardInfo`` under ``ps_backup(index)`` (never under ``ps``, so
        no client takes a backup for its shard)."""
        return f"{self.prefix}ps-backup/"

    def ps_backup(self, index: int) -> str:
        return f"{self.ps_backups}{index:04d}"

    @property
    def ps_replicas(self) -> str:
        """Prefix of who holds each ps shard under ``--ps-replicas 1``: its primary and
        its backup in step (``rendezvous.schema.ps.ReplicaRecord``)."""
        return f"{self.prefix}ps-replica/"

    def ps_replica(self, index: int) -> str:
        return f"{self.ps_replicas}{index:04d}"

    @property
    def ps_rollback(self) -> str:
        """The newest rollback of the ps shards to an older state than they had reached
        (``rendezvous.schema.ps.RollbackRecord``); watched by the driver, which reports it."""
        return f"{self.prefix}ps-rollback"

    @property
    def shape(self) -> str:
        """What the nodes of a joined job agreed on (``elastic-run --join``): the first
        to join writes it, every later one must bring the same."""
        return f"{self.prefix}shape"

    # ---- restart mode (``elastic-run --restart-workers``)
    @property
    def worlds(self) -> str:
        """Prefix of what the workers of a world (restart mode) tell each other through
        the store; the leader deletes it whenever it starts a world."""
        return f"{self.prefix}world/"

    def world_master(self, world: int) -> str:
        """Where rank 0 of world ``world`` serves torch's c10d store (JSON of
        ``rendezvous.schema.worlds.WorldMaster``): written by rank 0's start, read by the others'
        before their program runs."""
        return f"{self.worlds}{world}/master"

    def world_seat(self, worker_id: str) -> str:
        """The seat a warm spare of restart mode takes in a world (JSON of
        ``rendezvous.schema.worlds.WorldSeat``): written by the driver when it gives the spare a
        seat, read by the spare, which waits for nothing else (not under ``worlds``:
        a spare waits across worlds, and its seat is written after they are cleared)."""
        return f"{self.prefix}seat/{worker_id}"

    # ---- elastic.torch's process groups (``elastic/torch/plane``)
    @property
    def torch_groups(self) -> str:
        """Prefix of the torch.distributed rendezvous keys of every round's process group."""
        return f"{self.prefix}torch/"

    def torch_group(self, round_id: int) -> str:
        """Prefix of round ``round_id``'s process group: its members' gloo or NCCL
        rendezvous keys, so a group of one round never meets one of another."""
        return f"{self.torch_groups}{round_id}/"

    # ---- per-host agents (``driver.agent``): records in ``rendezvous.schema.agents``
    @property
    def agents(self) -> str:
        """Prefix of the agents' records, one key per host under the agent's own lease."""
        return f"{self.prefix}agents/"

    def agent(self, host: str) -> str:
        """The agent of ``host`` (JSON of ``AgentRecord``): while it exists, the host's
        agent is alive; its lease lapsing means the host is lost."""
        return f"{self.agents}{_label(host)}"

    def assignments(self, host: str) -> str:
        """Prefix of what ``host`` should run, one ``Assignment`` per process; written by
        the leader only."""
        return f"{self.prefix}assign/{_label(host)}/"

    def assignment(self, host: str, process_id: str) -> str:
        return f"{self.assignments(host)}{_label(process_id)}"

    @property
    def processes(self) -> str:
        """Prefix of the process statuses the agents write (``ProcessStatus``)."""
        return f"{self.prefix}proc/"

    def process(self, host: str, process_id: str) -> str:
        """How process ``process_id`` of ``host`` runs or ended (written by its agent)."""
        return f"{self.processes}{_label(host)}/{_label(process_id)}"

    @property
    def preemptions(self) -> str:
        """Prefix of the hosts whose agent got SIGTERM (the scheduler's preemption): the
        agent writes ``preempted(host)`` and keeps its processes until the driver has
        had a snapshot written and stopped them, or its grace is over."""
        return f"{self.prefix}preempted/"

    def preempted(self, host: str) -> str:
        return f"{self.preemptions}{_label(host)}"

    def retire(self, host: str) -> str:
        """Written by the leader when discovery removed ``host`` and nothing of the job
        runs there: the agent whose id it holds stops and exits (naming the agent, so
        a later agent on the host, once discovery lists it again, is not touched)."""
        return f"{self.prefix}retire/{_label(host)}"

    @property
    def ended(self) -> str:
        """Written by the leader when the job is over: every agent stops what it runs and
        exits (a driver that dies leaves no such key: agents then wait for a successor
        for ``--driver-timeout``)."""
        return f"{self.prefix}ended"

    @property
    def outcome(self) -> str:
        """How and when a joined job (``--join``) ended (JSON of
        ``driver.join.ended.JobOutcome``), written by its leader at the end, after which
        everything under ``prefix`` is deleted; it stays, so that a node joining later is
        refused instead of starting the job over (``--new-job`` deletes it)."""
        return f"{ENDED_ROOT}/{self.job_id}"


def _label(name: str) -> str:
    """A host or process name as one key segment (a '/' would make it two)."""
    return name.replace("/", "%2F")
