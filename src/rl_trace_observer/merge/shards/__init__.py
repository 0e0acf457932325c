"""Span shards: the merged timeline as flat, versioned Parquet rows — the analysis format.

One row per merged event (slices, instants, counters, flow and async events), written by the merge's
own workers (``rl-trace merge --shards DIR``) and by the node tasks of a Ray merge, partitioned by step
and host (``DIR/step=<n>/host=<h>/part-*.parquet``), described by ``DIR/rl-trace-shards.json``.
``rl-trace report`` reads them; views (one step, one role, a Perfetto archive) are written from them
without reading the raw inputs again.

- :mod:`.schema`   the columns (``rl-trace-spans/1``) and the directory document (``rl-trace-shards/1``);
- :mod:`.sink`     a job's events → rows → Parquet parts (inside a merge worker);
- :mod:`.layout`   where parts go, the document, stale parts;
- :mod:`.dataset`  the one loader analysis code uses;
- :mod:`..views.view`     Perfetto outputs (per step, per role) written from the rows;
  :mod:`..views.archive` the Perfetto v58+ archive.

pyarrow is an optional extra (``rl-trace-observer[shards]``), imported only when shards are used.
"""
