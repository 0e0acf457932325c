"""Runs bigger than one machine: the merge done next to the data, one Ray task pinned to each node.

``rl-trace merge --ray`` / ``rl-trace collect --convert`` (:func:`.merge.ray_merge`):

1. survey   the nodes and their output directories, as ``rl-trace collect`` does (shared filesystems
            once, the same node labels, so paths plan the same way as a collected copy's);
2. inventory  on each node: what every file is (head sniffed there), its size, its duplicate
            fingerprint, the process records' bytes — kilobytes travel, never trace bytes;
3. plan     on the driver, exactly as a single-machine merge plans (clocks, identities, job order);
4. convert  on each node: that node's jobs (host clock correction and per-artifact alignment: an
            artifact's partners live on its host), writing compressed pieces and span shards;
5. gather   the pieces and shards stream to the driver, which stitches the one output (one gzip
            member) and the manifest. A finished job's result is kept beside the output, so a re-run
            after a node died or stalled does only what is missing.

This package is above both merge/ and integrations/ (rank 4): it is the only place that needs Ray
and the merger at once. The node side (:mod:`.node`) imports no Ray.
"""
