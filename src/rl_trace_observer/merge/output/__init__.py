"""What the merge writes, from the jobs' pieces to the file on disk: the Chrome JSON writer
(:mod:`.chrome_json`), the Perfetto protobuf writers (:mod:`.pftrace`, :mod:`.pftrace_fused` and its
compiled twin), deflate pieces stitched into one gzip member (:mod:`.compress`), the workers' part
files (:mod:`.spill`), the output's write-back (:mod:`.writeback`) and temp names that carry their
owner (:mod:`.owned`). No reading of inputs here."""
