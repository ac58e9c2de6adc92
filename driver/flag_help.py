"""The prose of ``elastic-run --help`` around its flags (``driver.flags``): what the
command is (``DESCRIPTION``), and after the flags (``EPILOG``) examples, what the store
choice means for the driver's death, how the trained state is kept, etcd's own
security, and the exit statuses.

Why apart: it is the user's text about the whole command, read as a page; each flag's
own line stays beside its declaration.
"""

from __future__ import annotations

DESCRIPTION = """\
Run COMMAND as an elastic, fault-tolerant training job: one worker process per slot,
re-formed into a new round whenever workers fail or hosts come and go."""

EPILOG = """\
examples:
  elastic-run -np 2 python train.py
      two workers on this machine; a failed worker is replaced
  elastic-run -np 4 -H node1:2,node2:2 python train.py
      four workers on two hosts (ssh to hosts that are not this machine)
  elastic-run --min-np 2 --max-np 16 --host-discovery-script ./discover_hosts.sh \\
      --rendezvous etcd://10.0.0.5:2379,10.0.0.6:2379 python train.py
      grows and shrinks between 2 and 16 workers as the script's host list changes
  elastic-run --restart-workers -np 4 -H node1:2,node2:2 python train_ddp.py
      a torchrun script, unchanged: every worker restarts when one fails or a host goes

the driver and the store: with the default embedded store the driver *is* the store,
so its death ends the job (every worker stops). With --rendezvous etcd://... an agent
on each host runs that host's workers and keeps them training if the driver dies, for
--driver-timeout; use etcd for long jobs.

keeping the trained state: --checkpoint-dir DIR snapshots it every --checkpoint-interval;
the same command started again (after a crash, a preemption, a requeue) resumes from the
newest snapshot. SIGTERM or SIGINT writes a final snapshot first.

etcd's own security: anyone who reaches etcd's port can read the job's records and
delete or overwrite them (a record without the job's signature is ignored, but one
deleted still stops the job). Let only the job reach etcd, or make etcd check who
calls: etcds:// with client certificates (--etcd-cert, --etcd-key) or etcd users
(--etcd-user, with the password in ELASTIC_ETCD_PASSWORD).

exit status: 0 when every worker of the final round (with --restart-workers: of a
world) exited 0; 1 with a one-line reason when the job failed (reset limit exceeded,
elastic timeout, no usable hosts, a program that cannot start, a job id that a live job
holds, the committed state lost); 2 for bad arguments (also: an etcd that speaks TLS
where the URL does not, or the reverse; a --join node whose job has ended, without
--new-job); 3 when another driver took the job over (this one steers nothing more and
leaves the workers to it); 128+N when stopped by signal N (143: SIGTERM, 130: SIGINT),
after a final snapshot with --checkpoint-dir: a stopped job is not a failed one, and the
same command resumes it; 0 for a --standby whose job ended under its leader, and for a
--join node that left on SIGTERM while the job goes on elsewhere."""
