"""Bytes on disk: input files found and read exactly once (:mod:`.sources`), the gzip codec that
stitches parallel deflate pieces into one member (:mod:`.compress`), the workers' part files
(:mod:`.spill`) and the output's write-back (:mod:`.writeback`). No timeline knowledge here."""
