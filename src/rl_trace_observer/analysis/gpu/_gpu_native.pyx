# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of the GPU analysis' per-kernel loops: :func:`.breakdown.union_pass`,
:func:`.breakdown.edge_waits` and :func:`.attribute.place`, the same decisions line for line with
the integers in C. The Python functions stay the reference; ``tests/test_gpu.py`` requires both to
give identical results. Why: those loops visit each kernel four times (placing it, then its run, step
and stage figures): about 6 CPU s for the 1M kernels of the 10M-event generated run in Python.
"""

from cpython.long cimport PyLong_AsLongLong

cdef long long UNKNOWN = -(1 << 62)


def union_pass(list starts, list ends, list codes, list launches, list launch_ends):
    cdef Py_ssize_t i, n = len(starts)
    cdef long long s, e, launched, le
    cdef long long bs = UNKNOWN, be = UNKNOWN, cs = UNKNOWN, ce = UNKNOWN
    cdef long long ms = UNKNOWN, me = UNKNOWN, xs = UNKNOWN, xe = UNKNOWN
    cdef long long comp = 0, comm = 0, both = 0, busy = 0
    cdef int k
    cdef list pieces = [], firsts = [], delays = []
    for i in range(n):
        s = PyLong_AsLongLong(starts[i])
        e = PyLong_AsLongLong(ends[i])
        k = <int>PyLong_AsLongLong(codes[i])
        if s > be:
            if be > bs:
                pieces.append((bs, be))
                busy += be - bs
            elif firsts:
                firsts.pop()
            bs = s
            be = e
            firsts.append(launches[i])
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
        le = PyLong_AsLongLong(launch_ends[i])
        if le != UNKNOWN:
            delays.append(s - le if s > le else 0)
    if be > bs:
        pieces.append((bs, be))
        busy += be - bs
    elif firsts:
        firsts.pop()
    return pieces, firsts, delays, comp + ce - cs, comm + me - ms, both + xe - xs, busy


def edge_waits(list pieces, list firsts, long long lo, long long hi, long long threshold):
    cdef long long host = 0, kernel = 0, other = 0, prev = lo, s, e, b, launched
    cdef Py_ssize_t i
    cdef tuple piece
    for i in range(len(pieces)):
        piece = pieces[i]
        s = PyLong_AsLongLong(piece[0])
        e = PyLong_AsLongLong(piece[1])
        if s > prev:
            if prev >= hi:
                break
            b = s if s < hi else hi
            launched = PyLong_AsLongLong(firsts[i])
            if launched != UNKNOWN and launched > prev:
                host += b - prev
            elif s - prev < threshold:
                kernel += b - prev
            else:
                other += b - prev
        if e > prev:
            prev = e
    if prev < hi:
        host += hi - prev
    return host, kernel, other


cdef Py_ssize_t _right(list values, long long t):
    """bisect.bisect_right over a sorted list of ints."""
    cdef Py_ssize_t lo = 0, hi = len(values), mid
    while lo < hi:
        mid = (lo + hi) // 2
        if t < PyLong_AsLongLong(values[mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def place(
    long long[:] k_pid, long long[:] k_ts, long long[:] k_corr, dict code_of, dict last, first,
    dict many, long long[:] l_ts, long long[:] l_dur, long long[:] l_pid, list wins, list segs,
    long long[:] launch_ts, long long[:] launch_end, unsigned char[:] rule, long long[:] window,
    long long[:] stage, pick, long long codes,
):
    cdef Py_ssize_t i, n = k_ts.shape[0], k, li, a, b2
    cdef long long ts, corr, t, code, key, pid, last_pid = -(1 << 62), last_code = 0
    cdef object got
    cdef list starts, spans, reach
    cdef tuple win, seg
    for i in range(n):
        ts = k_ts[i]
        corr = k_corr[i]
        pid = k_pid[i]
        if pid != last_pid:  # kernels come in runs of one process: one dict lookup per run
            last_code = code_of[pid]
            last_pid = pid
        code = last_code
        key = corr * codes + code
        got = last.get(key) if corr >= 0 else None
        if got is not None:
            li = got
            if first is not None and first[key] != li:
                if key in many:
                    li = pick(many[key], ts)
                else:  # _of_two: the later of the two at or before the kernel, else the earlier
                    a = first[key]
                    b2 = li
                    if l_ts[a] > l_ts[b2]:
                        a, b2 = b2, a
                    li = b2 if l_ts[b2] <= ts else a
            t = l_ts[li]
            code = code_of[l_pid[li]]
            launch_ts[i] = t
            launch_end[i] = t + l_dur[li]
        else:
            t = ts
            rule[i] = 1
        win = wins[code]
        starts, spans, reach = win[0], win[1], win[2]
        k = _right(starts, t) - 1
        while k >= 0 and PyLong_AsLongLong(reach[k]) > t:
            if t < PyLong_AsLongLong(spans[k][1]):
                window[i] = PyLong_AsLongLong(spans[k][2])
                break
            k -= 1
        if segs[code] is not None:
            seg = segs[code]
            k = _right(seg[0], t) - 1
            if k >= 0 and t < PyLong_AsLongLong(seg[1][k]):
                stage[i] = PyLong_AsLongLong(seg[2][k])


from cpython.float cimport PyFloat_AS_DOUBLE
from libc.math cimport rint
from array import array

cdef double FAST_US = 8589934592.0  # 2**33 µs: below it round(us * 1000) is exact (load._FAST_US)


def ns_array(list values, us_to_ns):
    """µs values (float or int, ≤ 3 decimals) → an ``array('q')`` of exact ns: ``round(v * 1000)``
    below 2**33 µs (C ``rint`` rounds half to even, as Python's ``round``), else ``us_to_ns(v)``."""
    cdef Py_ssize_t i, n = len(values)
    cdef double v
    cdef object x
    out = array("q", bytes(8 * n))
    cdef long long[:] view = out
    for i in range(n):
        x = values[i]
        if type(x) is float:
            v = PyFloat_AS_DOUBLE(x)
            if 0 <= v < FAST_US:
                view[i] = <long long>rint(v * 1000.0)
                continue
        elif type(x) is int and 0 <= x < 9223372036854775:
            view[i] = PyLong_AsLongLong(x) * 1000
            continue
        view[i] = us_to_ns(x)
    return out
