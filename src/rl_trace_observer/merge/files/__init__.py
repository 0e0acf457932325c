"""Input bytes on disk: files found and read exactly once, in bounded blocks (:mod:`.sources`),
inflated as they are read with decompression bombs refused (:mod:`.inflate`), the machine's memory
budget per file (:mod:`.budget`) and what is a regular file at all (:mod:`.kinds`). No timeline
knowledge here; what the merge writes is :mod:`..output`."""
