# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""Compiled twin of the GPU analysis' per-kernel loops (:mod:`.loops`, and :func:`.attribute.place`
as :func:`place_sorted`): the same decisions with the integers in C, on ``array('q')`` columns. The
Python functions stay the reference; ``tests/test_gpu.py`` requires both to give identical results.
Why: the analysis visits each kernel five times (placing it, its run, step and stage figures, its
stream): ~6 CPU s for the 1M kernels of the 10M-event generated run with Python objects per kernel.
C++ only for ``std::sort`` / ``std::nth_element``.
"""

from cpython cimport array as carray
from cpython.long cimport PyLong_AsLongLong
from libc.stdlib cimport free, malloc
from libcpp.algorithm cimport nth_element, sort as std_sort

from array import array


# The sha256 of this file, defined by setup.py at build time: common/twins.py ignores a twin whose
# hash differs from its source's (a build from another version), whatever the files' times say.
cdef extern from *:
    """
    #ifndef RL_TRACE_SOURCE_SHA256
    #define RL_TRACE_SOURCE_SHA256 ""
    #endif
    """
    const char* RL_TRACE_SOURCE_SHA256

SOURCE_SHA256 = (<bytes>RL_TRACE_SOURCE_SHA256).decode("ascii")

cdef long long UNKNOWN = -(1 << 62)
cdef carray.array _Q = array("q")


cdef inline carray.array _new(Py_ssize_t n):
    return carray.clone(_Q, n, False)


cdef inline carray.array _shrink(carray.array a, Py_ssize_t n):
    carray.resize(a, n)
    return a


def take(const long long[:] src, const long long[:] positions):
    cdef Py_ssize_t i, n = positions.shape[0]
    cdef carray.array out = _new(n)
    cdef long long* o = out.data.as_longlongs
    for i in range(n):
        o[i] = src[positions[i]]
    return out


def gather_columns(const long long[:] order, const long long[:] ts, const long long[:] dur,
                   const long long[:] names, const long long[:] code_of_name,
                   const long long[:] launch_ts, const long long[:] launch_end):
    cdef Py_ssize_t j, i, n = order.shape[0]
    cdef carray.array s = _new(n), e = _new(n), c = _new(n), l = _new(n), le = _new(n)
    cdef long long* ps = s.data.as_longlongs
    cdef long long* pe = e.data.as_longlongs
    cdef long long* pc = c.data.as_longlongs
    cdef long long* pl = l.data.as_longlongs
    cdef long long* ple = le.data.as_longlongs
    for j in range(n):
        i = order[j]
        ps[j] = ts[i]
        pe[j] = ts[i] + dur[i]
        pc[j] = code_of_name[names[i]]
        pl[j] = launch_ts[i]
        ple[j] = launch_end[i]
    return s, e, c, l, le


cdef struct Key4:
    long long a
    long long b
    long long c
    long long d


cdef bint _less4(const Key4& x, const Key4& y) noexcept nogil:
    if x.a != y.a:
        return x.a < y.a
    if x.b != y.b:
        return x.b < y.b
    if x.c != y.c:
        return x.c < y.c
    return x.d < y.d


def order_kernels(const long long[:] pid, const long long[:] ts, const long long[:] launch):
    cdef Py_ssize_t i, n = ts.shape[0]
    cdef Key4* keys = <Key4*>malloc(max(n, 1) * sizeof(Key4))
    cdef carray.array out = _new(n)
    if keys == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            keys[i].a = pid[i]
            keys[i].b = ts[i]
            keys[i].c = launch[i]
            keys[i].d = i
        std_sort(keys, keys + n, _less4)
        for i in range(n):
            out.data.as_longlongs[i] = keys[i].d
    finally:
        free(keys)
    return out


def union_pass(const long long[:] starts, const long long[:] ends, const long long[:] codes,
               const long long[:] launches, const long long[:] launch_ends):
    cdef Py_ssize_t i, n = starts.shape[0], np = 0, nd = 0
    cdef long long s, e, le
    cdef long long bs = UNKNOWN, be = UNKNOWN, cs = UNKNOWN, ce = UNKNOWN
    cdef long long ms = UNKNOWN, me = UNKNOWN, xs = UNKNOWN, xe = UNKNOWN
    cdef long long comp = 0, comm = 0, both = 0, busy = 0
    cdef long long k
    cdef carray.array p_start = _new(n), p_end = _new(n), firsts = _new(n), delays = _new(n)
    cdef long long* ps = p_start.data.as_longlongs
    cdef long long* pe = p_end.data.as_longlongs
    cdef long long* pf = firsts.data.as_longlongs
    cdef long long* pd = delays.data.as_longlongs
    for i in range(n):
        s = starts[i]
        e = ends[i]
        k = codes[i]
        if s > be:
            if be > bs:
                ps[np] = bs
                pe[np] = be
                np += 1
                busy += be - bs
            bs = s
            be = e
            pf[np] = launches[i]
        elif e > be:
            be = e
        if k < 2:
            if s > xe:
                both += xe - xs
                xs = s
                xe = e
            elif e > xe:
                xe = e
            if k == 0:
                if s > ce:
                    comp += ce - cs
                    cs = s
                    ce = e
                elif e > ce:
                    ce = e
            elif s > me:
                comm += me - ms
                ms = s
                me = e
            elif e > me:
                me = e
        le = launch_ends[i]
        if le != UNKNOWN:
            pd[nd] = s - le if s > le else 0
            nd += 1
    if be > bs:
        ps[np] = bs
        pe[np] = be
        np += 1
        busy += be - bs
    return (_shrink(p_start, np), _shrink(p_end, np), _shrink(firsts, np), _shrink(delays, nd),
            comp + ce - cs, comm + me - ms, both + xe - xs, busy)


cdef inline int _judge(long long a, long long next_start, long long launched, long long threshold):
    if launched != UNKNOWN and launched > a:
        return 0
    return 1 if next_start - a < threshold else 2


def edge_waits(const long long[:] p_start, const long long[:] p_end, const long long[:] firsts,
               long long lo, long long hi, long long threshold):
    cdef long long host = 0, kernel = 0, other = 0, prev = lo, s, e, b
    cdef Py_ssize_t i
    cdef int j
    for i in range(p_start.shape[0]):
        s = p_start[i]
        e = p_end[i]
        if s > prev:
            if prev >= hi:
                break
            b = s if s < hi else hi
            j = _judge(prev, s, firsts[i], threshold)
            if j == 0:
                host += b - prev
            elif j == 1:
                kernel += b - prev
            else:
                other += b - prev
        if e > prev:
            prev = e
    if prev < hi:
        host += hi - prev
    return host, kernel, other


cdef inline Py_ssize_t _left(const long long[:] values, long long t) noexcept:
    """bisect.bisect_left over a sorted column."""
    cdef Py_ssize_t lo = 0, hi = values.shape[0], mid
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


def span_waits(const long long[:] p_start, const long long[:] p_end, const long long[:] firsts,
               const long long[:] cpu_start, const long long[:] cpu_end, long long threshold):
    """:func:`.loops.span_waits`: ``cpu`` minus the pieces (``iv.subtract``), each idle piece judged
    by the first piece starting at or after its end."""
    cdef long long waits[3]
    cdef Py_ssize_t c, j = 0, k, jj, npieces = p_start.shape[0]
    cdef long long cur, a_end, x, y
    waits[0] = waits[1] = waits[2] = 0
    for c in range(cpu_start.shape[0]):
        cur = cpu_start[c]
        a_end = cpu_end[c]
        while j < npieces and p_end[j] <= cur:
            j += 1
        k = j
        while True:
            if k < npieces and p_start[k] < a_end:
                if p_start[k] <= cur:
                    if p_end[k] > cur:
                        cur = p_end[k]
                    k += 1
                    continue
                x = cur
                y = p_start[k]
                if p_end[k] > cur:
                    cur = p_end[k]
                k += 1
            elif cur < a_end:
                x = cur
                y = a_end
                cur = a_end
            else:
                break
            jj = _left(p_start, y)
            if jj == npieces:
                waits[0] += y - x
            else:
                waits[_judge(x, p_start[jj], firsts[jj], threshold)] += y - x
    return waits[0], waits[1], waits[2]


def stream_gaps(const long long[:] order, const long long[:] ts, const long long[:] dur,
                const long long[:] stream, const long long[:] launch_ts, long long threshold):
    """:func:`.loops.stream_gaps`: (stream, kernels, host, kernel, other) per stream, by stream."""
    cdef Py_ssize_t j, i, slot, n = order.shape[0], m
    cdef dict slots = {}
    cdef list streams = sorted({stream[order[j]] for j in range(n)})
    for slot in range(len(streams)):
        slots[streams[slot]] = slot
    m = len(streams)
    cdef carray.array acc = carray.clone(_Q, 5 * m, True)  # prev_end, count, host, kernel, other
    cdef long long* a = acc.data.as_longlongs
    cdef long long last_stream = -1, gap, launched, prev_end
    slot = -1
    for j in range(n):
        i = order[j]
        if stream[i] != last_stream or slot < 0:
            last_stream = stream[i]
            slot = slots[last_stream]
        if a[5 * slot + 1]:
            prev_end = a[5 * slot]
            gap = ts[i] - prev_end
            launched = launch_ts[i]
            if gap <= 0:  # started before the kernels before it ended (overlapping launches): no gap
                pass
            elif launched != UNKNOWN and launched > prev_end:
                a[5 * slot + 2] += gap
            elif gap < threshold:
                a[5 * slot + 3] += gap
            else:
                a[5 * slot + 4] += gap
            if ts[i] + dur[i] > prev_end:
                a[5 * slot] = ts[i] + dur[i]
        else:
            a[5 * slot] = ts[i] + dur[i]
        a[5 * slot + 1] += 1
    return [(streams[s], a[5 * s + 1], a[5 * s + 2], a[5 * s + 3], a[5 * s + 4]) for s in range(m)]


def name_totals(const long long[:] order, const long long[:] names, const long long[:] dur,
                Py_ssize_t count):
    cdef carray.array c = carray.clone(_Q, count, True), t = carray.clone(_Q, count, True)
    cdef carray.array mx = carray.clone(_Q, count, True)
    cdef long long* pc = c.data.as_longlongs
    cdef long long* pt = t.data.as_longlongs
    cdef long long* pm = mx.data.as_longlongs
    cdef Py_ssize_t j, i, k
    cdef long long d
    for j in range(order.shape[0]):
        i = order[j]
        k = names[i]
        d = dur[i]
        pc[k] += 1
        pt[k] += d
        if d > pm[k]:
            pm[k] = d
    return c, t, mx


def group(const long long[:] keys):
    """Positions per key, each in order: {key: array('q')}."""
    cdef Py_ssize_t j, n = keys.shape[0]
    cdef dict counts = {}, out = {}, fill = {}
    cdef long long last = 0, k
    cdef Py_ssize_t run = 0
    for j in range(n):
        k = keys[j]
        if run and k == last:
            run += 1
            continue
        if run:
            counts[last] = counts.get(last, 0) + run
        last = k
        run = 1
    if run:
        counts[last] = counts.get(last, 0) + run
    cdef carray.array dest
    cdef Py_ssize_t at = 0
    for key, c in counts.items():
        out[key] = _new(c)
        fill[key] = 0
    last_arr = None
    for j in range(n):
        k = keys[j]
        if last_arr is None or k != last:
            if last_arr is not None:
                fill[last] = at
            last = k
            last_arr = out[k]
            dest = last_arr
            at = fill[k]
        dest.data.as_longlongs[at] = j
        at += 1
    return out


def ranks(carray.array values, list wanted):
    """The values at the sorted positions ``wanted`` (ascending), by ``nth_element`` (reorders)."""
    cdef long long* v = values.data.as_longlongs
    cdef Py_ssize_t n = len(values), r, prev = 0
    cdef list out = []
    for r in wanted:
        nth_element(v + prev, v + r, v + n)
        out.append(v[r])
        prev = r
    return out


def codes_of(const long long[:] pids, dict code_of):
    """Per row, ``code_of[pid]`` (rows come in runs of one process: one lookup per run)."""
    cdef Py_ssize_t i, n = pids.shape[0]
    cdef carray.array out = _new(n)
    cdef long long last = 0, code = 0
    cdef bint have = False
    for i in range(n):
        if not have or pids[i] != last:
            last = pids[i]
            code = code_of[last]
            have = True
        out.data.as_longlongs[i] = code
    return out


cdef inline Py_ssize_t _right_in(const long long[:] values, Py_ssize_t lo, Py_ssize_t hi, long long t) noexcept:
    """bisect.bisect_right over values[lo:hi] (an index into values)."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi) // 2
        if t < values[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def place_sorted(
    const long long[:] k_code, const long long[:] k_ts, const long long[:] k_corr,
    const long long[:] l_code, const long long[:] l_corr, const long long[:] l_ts, const long long[:] l_dur,
    const long long[:] code_wins, const long long[:] w_off, const long long[:] w_start,
    const long long[:] w_end, const long long[:] w_idx, const long long[:] w_reach,
    const long long[:] code_segs, const long long[:] s_off, const long long[:] s_start,
    const long long[:] s_end, const long long[:] s_id,
    long long[:] launch_ts, long long[:] launch_end, unsigned char[:] rule, long long[:] window,
    long long[:] stage,
):
    """:func:`.attribute.place` with the launches sorted by (process, id, time) instead of dicts:
    of the launches sharing a kernel's id, the latest at or before it, else the first by time (the
    reference's ``last`` / ``_of_two`` / ``_pick``, one rule); then its step window and stage."""
    cdef Py_ssize_t i, n = k_ts.shape[0], nl = l_ts.shape[0], lo, hi, mid, p, li, k, base
    cdef long long ts, corr, t, code
    cdef Key4* keys = <Key4*>malloc(max(nl, 1) * sizeof(Key4))
    if keys == NULL:
        raise MemoryError()
    try:
        for i in range(nl):
            keys[i].a = l_code[i]
            keys[i].b = l_corr[i]
            keys[i].c = l_ts[i]
            keys[i].d = i
        std_sort(keys, keys + nl, _less4)
        for i in range(n):
            ts = k_ts[i]
            corr = k_corr[i]
            code = k_code[i]
            li = -1
            if corr >= 0:
                lo = 0
                hi = nl
                while lo < hi:  # first launch with (code, corr) >= the kernel's
                    mid = (lo + hi) // 2
                    if keys[mid].a < code or (keys[mid].a == code and keys[mid].b < corr):
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < nl and keys[lo].a == code and keys[lo].b == corr:
                    p = lo
                    hi = nl
                    while p < hi:  # the first past (code, corr, ts): the one before it is the pick
                        mid = (p + hi) // 2
                        if keys[mid].a == code and keys[mid].b == corr and keys[mid].c <= ts:
                            p = mid + 1
                        else:
                            hi = mid
                    li = keys[p - 1 if p > lo else lo].d
            if li >= 0:
                t = l_ts[li]
                code = l_code[li]
                launch_ts[i] = t
                launch_end[i] = t + l_dur[li]
            else:
                t = ts
                rule[i] = 1
            base = w_off[code_wins[code]]
            k = _right_in(w_start, base, w_off[code_wins[code] + 1], t) - 1
            while k >= base and w_reach[k] > t:
                if t < w_end[k]:
                    window[i] = w_idx[k]
                    break
                k -= 1
            if code_segs[code] >= 0:
                base = s_off[code_segs[code]]
                k = _right_in(s_start, base, s_off[code_segs[code] + 1], t) - 1
                if k >= base and t < s_end[k]:
                    stage[i] = s_id[k]
    finally:
        free(keys)


cdef inline bint _space(unsigned char c) noexcept:
    return c == 32 or c == 9 or c == 10 or c == 12 or c == 13  # RE2's \s


def arg_ints(const int[:] offsets, const unsigned char[:] data, bytes key):
    """Per string of an Arrow string column (``offsets``, ``data``): the integer of the leftmost match
    of ``KEY\s*:\s*(-?\d+)\s*[,}]`` — what :func:`..report.shards._arg_ints` reads with Arrow's RE2 —
    or -1 where there is none or it is negative (every caller treats both alike). OverflowError past
    18 digits: the caller then asks Arrow, which says what it says about such a value."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i, p, q, end, klen = len(key), digits
    cdef const unsigned char* k = key
    cdef long long v, value
    cdef bint neg, same
    cdef carray.array out = _new(max(n, 0))
    for i in range(n):
        end = offsets[i + 1]
        value = -1
        p = offsets[i]
        while p + klen <= end:
            same = data[p] == k[0]
            q = 1
            while same and q < klen:
                same = data[p + q] == k[q]
                q += 1
            if same:
                q = p + klen
                while q < end and _space(data[q]):
                    q += 1
                if q < end and data[q] == 58:  # ':'
                    q += 1
                    while q < end and _space(data[q]):
                        q += 1
                    neg = q < end and data[q] == 45  # '-'
                    if neg:
                        q += 1
                    digits = 0
                    v = 0
                    while q < end and 48 <= data[q] <= 57 and digits <= 18:
                        v = v * 10 + (data[q] - 48)
                        digits += 1
                        q += 1
                    if digits:
                        while q < end and _space(data[q]):
                            q += 1
                        if digits > 18:
                            raise OverflowError("an args integer past 18 digits")
                        if q < end and (data[q] == 44 or data[q] == 125):  # ',' '}'
                            value = -1 if neg and v != 0 else v
                            break
            p += 1
        out.data.as_longlongs[i] = value
    return out


def nonneg_positions(const long long[:] values):
    """Positions of the values >= 0."""
    cdef Py_ssize_t i, m = 0, n = values.shape[0]
    cdef carray.array out = _new(n)
    for i in range(n):
        if values[i] >= 0:
            out.data.as_longlongs[m] = i
            m += 1
    return _shrink(out, m)


def first_positions(const long long[:] codes, Py_ssize_t count):
    """Per code in [0, count): its first position in ``codes`` (-1: absent)."""
    cdef Py_ssize_t i
    cdef carray.array out = _new(count)
    for i in range(count):
        out.data.as_longlongs[i] = -1
    for i in range(codes.shape[0] - 1, -1, -1):
        out.data.as_longlongs[codes[i]] = i
    return out


cdef struct Pair:
    long long a
    long long b


cdef bint _less2(const Pair& x, const Pair& y) noexcept nogil:
    return x.a < y.a or (x.a == y.a and x.b < y.b)


def union_columns(list lists):
    """:func:`.loops.union_columns`: the union of (starts, ends) column pairs, as iv.union."""
    cdef Py_ssize_t n = 0, m = 0, i, j
    cdef const long long[:] s
    cdef const long long[:] e
    for pair in lists:
        n += len(pair[0])
    cdef Pair* v = <Pair*>malloc(max(n, 1) * sizeof(Pair))
    if v == NULL:
        raise MemoryError()
    cdef carray.array starts = _new(n), ends = _new(n)
    cdef long long* ps = starts.data.as_longlongs
    cdef long long* pe = ends.data.as_longlongs
    try:
        for pair in lists:
            s = pair[0]
            e = pair[1]
            for i in range(s.shape[0]):
                if e[i] > s[i]:
                    v[m].a = s[i]
                    v[m].b = e[i]
                    m += 1
        std_sort(v, v + m, _less2)
        j = 0
        for i in range(m):
            if j and v[i].a <= pe[j - 1]:
                if v[i].b > pe[j - 1]:
                    pe[j - 1] = v[i].b
            else:
                ps[j] = v[i].a
                pe[j] = v[i].b
                j += 1
    finally:
        free(v)
    return _shrink(starts, j), _shrink(ends, j)


def prefix_lengths(const long long[:] starts, const long long[:] ends):
    """[0, len(piece 0), len(pieces 0-1), ...]: :func:`.loops.prefix_lengths`."""
    cdef Py_ssize_t i, n = starts.shape[0]
    cdef carray.array out = _new(n + 1)
    cdef long long* o = out.data.as_longlongs
    o[0] = 0
    for i in range(n):
        o[i + 1] = o[i] + ends[i] - starts[i]
    return out


from cpython.float cimport PyFloat_AS_DOUBLE
from libc.math cimport rint
from array import array

cdef double FAST_US = 8589934592.0  # 2**33 µs: below it round(us * 1000) is exact (load._FAST_US)


cdef inline long long _ns(object x, object us_to_ns) except? -1:
    cdef double v
    if type(x) is float:
        v = PyFloat_AS_DOUBLE(x)
        if 0 <= v < FAST_US:
            return <long long>rint(v * 1000.0)
    elif type(x) is int and 0 <= x < 9223372036854775:
        return PyLong_AsLongLong(x) * 1000
    return PyLong_AsLongLong(us_to_ns(x))


def ns_array(list values, us_to_ns):
    """µs values (float or int, ≤ 3 decimals) → an ``array('q')`` of exact ns: ``round(v * 1000)``
    below 2**33 µs (C ``rint`` rounds half to even, as Python's ``round``), else ``us_to_ns(v)``."""
    cdef Py_ssize_t i, n = len(values)
    cdef carray.array out = _new(n)
    for i in range(n):
        out.data.as_longlongs[i] = _ns(values[i], us_to_ns)
    return out


from msgspec import UNSET


def event_columns(list events, us_to_ns, bint with_names):
    """A chunk's GPU events (or launches) as columns in one pass: pid, tid, ts and dur (ns, as
    :func:`ns_array`), names, categories, ``args`` (``b"{}"`` where absent) — :func:`..report.load.
    _gpu_columns`' list comprehensions. None where a pid / tid is not an int or a name / category
    not a str: the reference path takes those."""
    cdef Py_ssize_t i, n = len(events)
    cdef carray.array pid = _new(n), tid = _new(n), ts = _new(n), dur = _new(n)
    cdef list names = [], cats = [], raws = []
    cdef object empty = b"{}"
    for i in range(n):
        ev = events[i]
        p = ev.pid
        t = ev.tid
        if type(p) is not int or type(t) is not int:
            return None
        try:
            pid.data.as_longlongs[i] = PyLong_AsLongLong(p)
            tid.data.as_longlongs[i] = PyLong_AsLongLong(t)
        except OverflowError:
            return None
        ts.data.as_longlongs[i] = _ns(ev.ts, us_to_ns)
        d = ev.dur
        dur.data.as_longlongs[i] = _ns(d if d else 0, us_to_ns)
        if with_names:
            name = ev.name
            cat = ev.cat
            if type(name) is not str or type(cat) is not str:
                return None
            names.append(name)
            cats.append(cat)
        a = ev.args
        raws.append(empty if a is UNSET else a)
    return pid, tid, ts, dur, names, cats, raws


cdef inline long long _id(object x) except? -2:
    """An id that is an int >= 0 (not a bool), else -1; OverflowError past int64."""
    if type(x) is int:
        if x < 0:
            return -1
        return PyLong_AsLongLong(x)
    return -1


def id_columns(list ids):
    """``stream`` and ``correlation`` of decoded ``args`` (None: undecodable) as columns, -1 where
    not an int >= 0 — what every caller treats as absent."""
    cdef Py_ssize_t i, n = len(ids)
    cdef carray.array streams = _new(n), corrs = _new(n)
    for i in range(n):
        x = ids[i]
        if x is None:
            streams.data.as_longlongs[i] = -1
            corrs.data.as_longlongs[i] = -1
        else:
            streams.data.as_longlongs[i] = _id(x.stream)
            corrs.data.as_longlongs[i] = _id(x.correlation)
    return streams, corrs


def name_codes(list names, dict known):
    """Each name's id in ``known``, -1 where it has none yet."""
    cdef Py_ssize_t i, n = len(names)
    cdef carray.array out = _new(n)
    cdef object last = None, got
    cdef long long code = -1
    for i in range(n):
        name = names[i]
        if name is not last:
            got = known.get(name)
            code = -1 if got is None else PyLong_AsLongLong(got)
            last = name
        out.data.as_longlongs[i] = code
    return out
