"""The Prometheus text format, read with prometheus_client's parser at a fraction of its cost.

Why not just the parser: it costs ~10 µs per line, and one vLLM engine's page is ~270 lines
(most of them histogram buckets) — 8 engines at 1 Hz would be 2-3 % of a core, over our 1 %
budget. So prometheus_client's parser decides what every line MEANS (metric family, type, sample
name, labels) the first time the sampler sees it, and the result is cached under the line's exact
text before its value. A later page is split into lines, and a line whose key text is cached
needs only its value converted (``float``, which reads ``NaN``/``+Inf`` too). Any line that is
not cached — a new label set, a timestamp, a comment we have not seen — sends the page through
the full parser again, which refreshes the cache. The parser stays the authority; the cache only
remembers its answers.
"""

from __future__ import annotations

from typing import Any

MAX_CACHED_LINES = 50_000  # per target; a page that keeps inventing label sets is parsed in full


class Series:
    """One sample line's meaning: Prometheus family, its type, the sample name and labels.

    Immutable, with its hash computed once: the sampler looks every value's series up in a dict on
    every scrape (~200 per engine page), and a dataclass would hash its fields anew each time.
    """

    __slots__ = ("_hash", "family", "labels", "name", "type")

    def __init__(self, family: str, type: str, name: str, labels: tuple[tuple[str, str], ...]) -> None:
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "type", type)  # gauge, counter, histogram, summary, untyped, ...
        object.__setattr__(self, "name", name)  # the sample's own name: ``x_total``, ``x_bucket``, ...
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "_hash", hash((family, type, name, labels)))

    family: str
    type: str
    name: str
    labels: tuple[tuple[str, str], ...]
    _hash: int

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("Series is immutable")

    def _key(self) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
        return (self.family, self.type, self.name, self.labels)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Series) and self._key() == other._key())

    def __repr__(self) -> str:
        return f"Series{self._key()!r}"


_UNKNOWN = Series("", "", "", ())
_CREATED_OF = ("counter", "histogram", "summary")


def _creation_time(series: Series, page: list[tuple[Series, float]]) -> bool:
    """``x_created``: prometheus_client's creation timestamp of counter/histogram ``x`` — not a value.

    The classic text format has no type for it, so the parser reports it as a family of its own;
    it is one when the page also has the family it was made for.
    """
    if not series.name.endswith("_created"):
        return False
    if series.family != series.name:
        return series.type in _CREATED_OF
    base = series.name[: -len("_created")]
    return any(s.family == base and s.type in _CREATED_OF for s, _ in page)


def _parser() -> Any:
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families


def _series_key(line: str) -> str:
    """The text of a sample line before its value (the cache key)."""
    return line.rpartition(" ")[0]


class PageReader:
    """Reads one target's pages; keeps that target's cache of line meanings."""

    def __init__(self) -> None:
        self._known: dict[str, Series | None] = {}  # None: a line we skip (``_created``)
        self.full_parses = 0

    def read(self, text: str) -> list[tuple[Series, float]]:
        """Every sample of the page; raises ``ValueError`` when the page is not the text format."""
        fast = self._fast(text)
        if fast is not None:
            return fast
        return self._full(text)

    def _fast(self, text: str) -> list[tuple[Series, float]] | None:
        known = self._known
        if not known:
            return None
        out: list[tuple[Series, float]] = []
        append = out.append
        for line in text.split("\n"):
            if not line or line[0] == "#":
                continue
            key, _, value = line.rpartition(" ")
            series = known.get(key, _UNKNOWN)
            if series is None:
                continue
            if series is _UNKNOWN:
                return None
            try:
                append((series, float(value)))
            except ValueError:
                return None
        return out

    def _full(self, text: str) -> list[tuple[Series, float]]:
        self.full_parses += 1
        parse = _parser()
        every: list[tuple[Series, float]] = []
        for family in parse(text):
            for sample in family.samples:
                labels = tuple(sorted((str(k), str(v)) for k, v in sample.labels.items()))
                every.append((Series(family.name, family.type, sample.name, labels), float(sample.value)))
        if len(self._known) + len(every) > MAX_CACHED_LINES:
            self._known.clear()
        self._learn(text, every)
        return [(series, value) for series, value in every if not _creation_time(series, every)]

    def _learn(self, text: str, samples: list[tuple[Series, float]]) -> None:
        """Cache each sample line's key text under the meaning the parser gave it.

        The parser yields samples in the order of their lines; the pairing is only trusted when the
        counts agree and every line starts with its sample's name (else nothing is cached and every
        page of this target gets the full parser).
        """
        lines = [line for line in text.split("\n") if line.strip() and not line.lstrip().startswith("#")]
        if len(lines) != len(samples):
            return
        learned: dict[str, Series | None] = {}
        for line, (series, _value) in zip(lines, samples, strict=True):
            key = _series_key(line)
            if key.partition("{")[0] != series.name or key != key.strip() or key in learned:
                return
            learned[key] = None if _creation_time(series, samples) else series
        self._known.update(learned)
