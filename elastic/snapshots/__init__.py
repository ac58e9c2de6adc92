"""Durable snapshots of the workers' committed state (``--checkpoint-dir``).

A commit keeps the state in memory (``elastic.state``); a snapshot puts a committed copy
on disk, off the training path, so that nothing trained is lost when every worker is
(a preemption, a power cut, ``elastic-run`` killed with its workers). The parts, each
with one job:

* ``settings``: where and how often (``--checkpoint-dir``, ``--checkpoint-interval``,
  through the environment);
* ``codec``: a state's committed values as a small pickled skeleton and its large
  arrays as raw bytes (numpy here; ``elastic.torch`` registers tensors);
* ``parts``: how those arrays are cut into the parts the workers write in parallel
  (pure);
* ``structure``: the structure of a state (its attributes, its arrays' shapes) a
  snapshot is tagged with, and what differs between two (pure);
* ``keeping``: whose each snapshot in a folder is (its job, its state), and which a
  job loads, prunes, or deletes for room on a full disk (pure);
* ``files``: the files of one snapshot on disk: parts, a manifest written last,
  checksums, the newest complete one, pruning and room on a full disk (no networking);
* ``uncached``: a large file written around the page cache (``O_DIRECT``), through it
  where the file system refuses;
* ``schedule``: when rank 0 asks for the next snapshot, and of which commit (pure);
* ``coordination``: how the writers of one snapshot agree on its commit and learn that
  every part is durable: through the job's store, or alone in a world of one;
* ``snapshotter``: the process's snapshots: the commit hook, the writer thread, what a
  worker offers and loads when a round syncs, and the snapshot a stop asks for.
"""
