"""Questions asked of merged runs beyond the report, each the library side of a command: SQL over the
span table (:mod:`.sql`, a ``.json.gz`` converted to it by :mod:`.trace_table`, printed by
:mod:`.sql_format`: ``rl-trace sql``), run-to-run diffs (:mod:`.diff`, :mod:`.diff_render`:
``rl-trace diff``), and the critical path drawn into a trace (:mod:`.highlight`: ``rl-trace report
--critical-path``). Above the report: they reuse its loading and its figures."""
