"""Outputs written from span shards instead of the raw inputs: views of some steps or roles
(:mod:`.view`) and Perfetto v58+ archives with one file per host (:mod:`.archive`)."""
