"""Every artifact of a run → one Perfetto timeline. The entry is :func:`.pipeline.merge`.

Where an event goes, in order:

- ``plan/``       find the input files, sniff what each is, link them to their processes, select;
- ``clock/``      decide each host's correction (and each artifact's, on partners in its process);
- ``run/``        jobs in worker processes: for each file of a job —
- ``readers/``      decode its format onto the absolute ns timeline,
- ``transform/``    correct, filter, remap identities, drop what cannot nest, namespace flow ids,
- ``writers/``      serialise (Chrome JSON, Perfetto protobuf) into pieces the parent streams out;
- ``manifest/``   what went in, what came out, what went wrong.

``model``, ``identity``, ``options`` and ``compress`` are the shared vocabulary: events and
identities, merged pid/tid numbers, what a merge is asked for, and the gzip codec.
"""
