# cython: language_level=3, cdivision=True
"""Compiled twin of :meth:`.pftrace_fused.FusedWriter._write_thread`: the same decisions, line for
line, with the packets written into the writer's buffer by ``memcpy`` instead of joined from Python
bytes, and the varints computed in C.

Why: in Python the packet loop is half of a ``.pftrace`` merge (two packets per slice, ~10 temporary
bytes objects each). The Python method stays the reference; ``tests/test_pftrace_native.py`` requires
both to write identical bytes for the same events. Rare cases call back into the writer's Python
methods exactly where the Python method does, after nothing of ours is pending.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_FromDouble
from cpython.list cimport PyList_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_AsUnsignedLongLongMask
from cpython.ref cimport PyObject
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memchr, memcpy

cimport cython


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




cdef bint _has_u_escape(const char* p, Py_ssize_t n) noexcept:
    """``b"\\u" in text``: a backslash followed by ``u`` (backslashes are rare: memchr finds them)."""
    cdef const char* q
    cdef const char* end = p + n
    while p < end:
        q = <const char*>memchr(p, 92, end - p)
        if q == NULL or q + 1 >= end:
            return False
        if q[1] == 117:
            return True
        p = q + 1
    return False

from msgspec import UNSET, Raw

from rl_trace_observer.merge.timeline.model import Event

from operator import attrgetter

from ._pbwire import pack_double, varint
from ._pftrace_sink import BEGIN, COUNTER, END, INSTANT, K_DOUBLE_VALUE, K_FLOW, K_TERMINATING

cdef object _UNSET = UNSET


# An Event's fields read from their slots (the offsets its member descriptors hold), not by name: a
# lookup by name costs ~30 ns, seven of them per slice were ~6 % of a .pftrace.gz merge's CPU.
cdef extern from *:
    """
    #include "structmember.h"
    static inline PyObject* rl_slot(PyObject* o, Py_ssize_t off) { return *(PyObject**)((char*)o + off); }
    static inline Py_ssize_t rl_member_offset(PyObject* d) { return ((PyMemberDescrObject*)d)->d_member->offset; }
    """
    PyObject* rl_slot(PyObject* o, Py_ssize_t off) noexcept
    Py_ssize_t rl_member_offset(PyObject* d) noexcept


def _offset(name):
    descr = Event.__dict__[name]
    if type(descr).__name__ != "member_descriptor":
        raise ImportError(f"Event.{name} is not a slot")
    return rl_member_offset(<PyObject*>descr)


cdef Py_ssize_t O_PH = _offset("ph"), O_NAME = _offset("name"), O_CAT = _offset("cat")
cdef Py_ssize_t O_PID = _offset("pid"), O_TID = _offset("tid"), O_TS = _offset("ts")
cdef Py_ssize_t O_DUR = _offset("dur"), O_ID = _offset("id"), O_BIND = _offset("bind_id")
cdef Py_ssize_t O_BP = _offset("bp"), O_S = _offset("s"), O_ARGS = _offset("args")
cdef object _EVENT = Event


cdef inline object _f(object e, Py_ssize_t off, str name):
    """``e.<name>``, from its slot at ``off`` when ``e`` is exactly an ``Event`` (a subclass, or
    another object, is asked by name)."""
    cdef PyObject* v
    if type(e) is not _EVENT:
        return getattr(e, name)
    v = rl_slot(<PyObject*>e, off)
    if v == NULL:
        return getattr(e, name)  # a deleted field: Python's own AttributeError
    return <object>v

cdef bytes _BEGIN = BEGIN
cdef bytes _END = END
cdef bytes _INSTANT = INSTANT
cdef bytes _COUNTER = COUNTER
cdef bytes _K_DOUBLE = K_DOUBLE_VALUE
cdef bytes _K_FLOW = K_FLOW
cdef bytes _K_TERM = K_TERMINATING
cdef unsigned long long _GOLDEN = 0x9E3779B97F4A7C15ULL
cdef unsigned long long _MASK63 = 0x7FFFFFFFFFFFFFFFULL
cdef object _TWO63 = int("9223372036854775808")


cdef inline int _uvarint(unsigned char* p, unsigned long long v) noexcept:
    cdef int i = 0
    while v >= 0x80:
        p[i] = <unsigned char>((v & 0x7F) | 0x80)
        v >>= 7
        i += 1
    p[i] = <unsigned char>v
    return i + 1


cdef int _ts_varint(object t, unsigned char* p) except -1:
    """varint(int(t)) into p (10 bytes at most): ``int()`` truncates floats, varint masks to 64 bits."""
    cdef double d
    cdef long long v
    cdef int overflow = 0
    cdef bytes slow
    if type(t) is float:
        d = PyFloat_AS_DOUBLE(t)
        if -9.2e18 < d < 9.2e18:
            return _uvarint(p, <unsigned long long>(<long long>d))
        t = int(t)
    v = PyLong_AsLongLongAndOverflow(t, &overflow)
    if not overflow:
        return _uvarint(p, <unsigned long long>v)
    slow = varint(int(t))
    memcpy(p, PyBytes_AS_STRING(slow), PyBytes_GET_SIZE(slow))
    return <int>PyBytes_GET_SIZE(slow)


cdef inline char* _grow(bytearray buf, Py_ssize_t n) except NULL:
    """Room for ``n`` more bytes at the end of ``buf`` (bytearray over-allocates: amortised O(1)).
    Its 12.5 % steps are kept on purpose: in the merge's workers (no mmap, ``job.memory``) a growing
    buffer at the heap's top is extended in place; doubling it measured +11 % worker peak and more CPU."""
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buf)
    PyByteArray_Resize(buf, size + n)
    return PyByteArray_AS_STRING(buf) + size


cdef inline char* _copy(char* p, bytes b) noexcept:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(b)
    memcpy(p, PyBytes_AS_STRING(b), n)
    return p + n


cdef void _write_event(bytearray buf, object ts, bytes seq_needs, bytes a, bytes b, bytes c) except *:
    """``PacketSink._event(ts, a + b + c)`` when nothing is newly interned (base 0, ts >= 0): the
    timestamp, the sequence fields, then the TrackEvent's bytes (a BEGIN: type + track, name/args,
    flows)."""
    cdef unsigned char tv[10]
    cdef unsigned char nv[10]
    cdef unsigned char pv[10]
    cdef int ntv = _ts_varint(ts, tv)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(a) + PyBytes_GET_SIZE(b) + PyBytes_GET_SIZE(c)
    cdef int nnv = _uvarint(nv, <unsigned long long>n)
    cdef Py_ssize_t total = 1 + ntv + PyBytes_GET_SIZE(seq_needs) + 1 + nnv + n
    cdef int npv = _uvarint(pv, <unsigned long long>total)
    cdef char* p = _grow(buf, 1 + npv + total)
    p[0] = 0x0A
    memcpy(p + 1, pv, npv)
    p += 1 + npv
    p[0] = 0x40
    memcpy(p + 1, tv, ntv)
    p = _copy(p + 1 + ntv, seq_needs)
    p[0] = 0x5A
    memcpy(p + 1, nv, nnv)
    p = _copy(p + 1 + nnv, a)
    p = _copy(p, b)
    _copy(p, c)


cdef inline bytes _pack(unsigned long long f):
    cdef unsigned char b[8]
    cdef int i
    for i in range(8):
        b[i] = <unsigned char>(f & 0xFF)
        f >>= 8
    return (<char*>b)[:8]


cdef bytes _slice_body(bytes nref, object cref, object aref, object a):
    """name ref + category ref + the ``args`` annotation (legacy JSON ``a``), in one allocation:
    ``ref + cat + 0x22 + varint(len(ann)) + ann`` with ``ann = aref + 0x4A + varint(len(a)) + a``
    (TrackEvent.debug_annotations, DebugAnnotation.legacy_json_value)."""
    cdef Py_ssize_t nn = PyBytes_GET_SIZE(nref)
    cdef Py_ssize_t nc = PyBytes_GET_SIZE(<bytes>cref) if cref is not None else 0
    cdef Py_ssize_t na = 0, nr = 0, nann = 0
    cdef unsigned char v1[10]
    cdef unsigned char v2[10]
    cdef int l1 = 0, l2 = 0
    if a is not None:
        na = PyBytes_GET_SIZE(<bytes>a)
        nr = PyBytes_GET_SIZE(<bytes>aref)
        l2 = _uvarint(v2, <unsigned long long>na)
        nann = nr + 1 + l2 + na
        l1 = _uvarint(v1, <unsigned long long>nann)
    cdef Py_ssize_t total = nn + nc + ((1 + l1 + nann) if a is not None else 0)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(nref), nn)
    p += nn
    if nc:
        memcpy(p, PyBytes_AS_STRING(<bytes>cref), nc)
        p += nc
    if a is not None:
        p[0] = 0x22
        p += 1
        memcpy(p, v1, l1)
        p += l1
        memcpy(p, PyBytes_AS_STRING(<bytes>aref), nr)
        p += nr
        p[0] = 0x4A
        p += 1
        memcpy(p, v2, l2)
        p += l2
        memcpy(p, PyBytes_AS_STRING(<bytes>a), na)
    return out


# JSON text without whitespace outside strings: what ``msgspec.json.format(indent=-1)`` makes of valid
# JSON (tests/test_native_twins.py holds the two equal). Whitespace outside strings is skipped without a
# branch; a backslash in a string takes the byte after it along (an escaped quote does not end the
# string); the result is shrunk in place.
cdef extern from *:
    """
    static const unsigned char rl_json_keep[256] = {
        [0 ... 255] = 1, [32] = 0, [9] = 0, [10] = 0, [13] = 0};  /* ' ' \\t \\n \\r go */
    static PyObject* rl_compact_json(const char* p, Py_ssize_t n) {
        PyObject* out = PyBytes_FromStringAndSize(NULL, n);
        if (out == NULL) return NULL;
        char* q = PyBytes_AS_STRING(out);
        const unsigned char* s = (const unsigned char*)p;
        const unsigned char* end = s + n;
        Py_ssize_t k = 0;
        while (s < end) {
            unsigned char c = *s++;
            q[k] = (char)c;
            k += rl_json_keep[c];
            if (c == 34) {  /* a string, through its closing quote */
                while (s < end) {
                    c = *s++;
                    q[k++] = (char)c;
                    if (c == 34) break;
                    if (c == 92 && s < end) q[k++] = (char)*s++;  /* a backslash and the byte it escapes */
                }
            }
        }
        if (k != n && _PyBytes_Resize(&out, k) < 0) return NULL;
        return out;
    }
    """
    object rl_compact_json(const char* p, Py_ssize_t n)


cdef object _compact_one(object e, object a, object py_compact):
    """:func:`.pftrace_fused.compact_args` for one slice whose ``args`` ``a`` are not yet bytes, byte
    for byte: a text with a line break is compacted (``py_compact``, msgspec's, where a ``\\u`` escape
    may be a lone surrogate it cannot read); a non-empty object becomes ``bytes`` (``Raw`` when it holds
    ``\\u`` escapes: the writer's care), anything else no args. Returns the new ``args``."""
    cdef Py_buffer view
    cdef object text
    cdef const char* p
    cdef bint escapes
    PyObject_GetBuffer(a, &view, PyBUF_SIMPLE)
    try:
        p = <const char*>view.buf
        escapes = _has_u_escape(p, view.len)
        if memchr(p, 10, view.len) == NULL:  # no line break: as it is
            text = PyBytes_FromStringAndSize(p, view.len)
        elif escapes:
            text = py_compact(PyBytes_FromStringAndSize(p, view.len))
            escapes = _has_u_escape(PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))
        else:
            text = rl_compact_json(p, view.len)  # only whitespace outside strings goes: still no \\u
    finally:
        PyBuffer_Release(&view)
    if PyBytes_GET_SIZE(text) and PyBytes_AS_STRING(text)[0] == 123 and text != b"{}":
        if escapes:
            text = Raw(text)
    else:
        text = _UNSET
    e.args = text
    return text


def split_lanes(list events):
    """:func:`.pftrace_fused.split_lanes` with the phase tests on one character."""
    cdef dict lanes = {}
    cdef list off = []
    cdef set cold = set()
    cdef list slices = None
    cdef list rest = None
    cdef list lane
    cdef object unset = _UNSET
    cdef object last_pid = unset
    cdef object last_tid = unset
    cdef object e, pid, tid, sc
    cdef str ph
    cdef Py_UCS4 c
    for e in events:
        ph = _f(e, O_PH, "ph")
        c = ph[0] if len(ph) == 1 else 0
        if c == u"C" or c == u"b" or c == u"e" or c == u"n":
            off.append(e)
            continue
        if c == u"i" or c == u"I":
            sc = _f(e, O_S, "s")
            if sc == "g" or sc == "p":
                off.append(e)
                continue
        pid = _f(e, O_PID, "pid")
        tid = _f(e, O_TID, "tid")
        if tid != last_tid or pid != last_pid:
            lane = lanes.get((pid, tid))
            if lane is None:
                lane = lanes[(pid, tid)] = [[], []]
            slices = lane[0]
            rest = lane[1]
            last_pid, last_tid = pid, tid
        if c == u"X":
            if _f(e, O_DUR, "dur") is unset:
                e.dur = 0
            slices.append(e)
        else:
            rest.append(e)
            if c != u"s" and c != u"t" and c != u"f":
                cold.add((pid, tid))
    return lanes, off, cold


ctypedef struct _Key:
    double ts
    double dur
    Py_ssize_t i


cdef int _key_order(const void* a, const void* b) noexcept nogil:
    """By start, the longer first, then as they came: Python's two stable sorts in one."""
    cdef const _Key* x = <const _Key*>a
    cdef const _Key* y = <const _Key*>b
    if x.ts != y.ts:
        return -1 if x.ts < y.ts else 1
    if x.dur != y.dur:
        return -1 if x.dur > y.dur else 1
    return -1 if x.i < y.i else (1 if x.i > y.i else 0)


cdef bint _as_double(object v, double* out):
    """``v`` as a double that compares as ``v`` does: a float (not NaN), or an int within 2**53."""
    cdef long long iv
    cdef int overflow = 0
    if type(v) is float:
        out[0] = PyFloat_AS_DOUBLE(v)
        return out[0] == out[0]
    if type(v) is int:
        iv = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow or not (-9007199254740992 <= iv <= 9007199254740992):
            return False
        out[0] = <double>iv
        return True
    return False


cdef bint _sort_by_start(list events, bint longer_first) except -1:
    """Sort ``events`` in place by start (the longer first when asked), stably; False (nothing
    changed) when a time is not a number C compares as Python does — True means every one is."""
    cdef Py_ssize_t n = PyList_GET_SIZE(events), i
    cdef _Key* keys
    cdef bint ordered = True
    cdef object e
    cdef list copy
    if n == 0:
        return True
    keys = <_Key*>malloc(n * sizeof(_Key))  # a lone event is checked too: the merge relies on it
    if keys == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            e = events[i]
            if not _as_double(_f(e, O_TS, "ts"), &keys[i].ts):
                return False
            if not longer_first:
                keys[i].dur = 0
            elif not _as_double(_f(e, O_DUR, "dur"), &keys[i].dur):
                return False
            keys[i].i = i
            if ordered and i and _key_order(&keys[i - 1], &keys[i]) > 0:
                ordered = False
        if not ordered:
            qsort(keys, n, sizeof(_Key), _key_order)
            copy = list(events)
            for i in range(n):
                events[i] = copy[keys[i].i]
        return True
    finally:
        free(keys)


_TS = attrgetter("ts")
_DUR = attrgetter("dur")


cdef list _merged_by_python(list slices, list rest):
    """The reference's merge: flow events by start, then one stable sort of slices + flow events."""
    rest.sort(key=_TS)
    seq = slices + rest
    seq.sort(key=_TS)
    return seq


def order_thread(list slices, list rest, bint in_order):
    """:func:`.pftrace_fused.order_thread`: the same list, sorted and merged in C where every time is
    a number C compares exactly as Python does (else by Python's sorts). Slices said to be in order are
    checked as they are merged (one walk): a start C cannot compare, or one that goes back, and the
    merged list is dropped for Python's."""
    cdef Py_ssize_t ns, nr, i = 0, j = 0, k
    cdef double a = 0, b = 0, last = 0
    cdef list seq
    if not in_order and not _sort_by_start(slices, True):
        slices.sort(key=_DUR, reverse=True)
        slices.sort(key=_TS)
        return _merged_by_python(slices, rest) if rest else slices
    if not rest:
        return slices
    if not _sort_by_start(rest, False):
        return _merged_by_python(slices, rest)
    # every start of ``rest`` is now known to be a number C compares as Python does; a slice's is
    # checked when it is reached (sorted slices were all checked by _sort_by_start)
    ns, nr = PyList_GET_SIZE(slices), PyList_GET_SIZE(rest)
    seq = []
    if ns:
        if not _as_double(_f(slices[0], O_TS, "ts"), &a):
            return _merged_by_python(slices, rest)
        last = a
    if nr:
        _as_double(_f(rest[0], O_TS, "ts"), &b)
    while i < ns and j < nr:  # a merge of two sorted runs: slices first at equal times
        if b < a:
            seq.append(rest[j])
            j += 1
            if j < nr:
                _as_double(_f(rest[j], O_TS, "ts"), &b)
        else:
            seq.append(slices[i])
            i += 1
            if i < ns:
                if not _as_double(_f(slices[i], O_TS, "ts"), &a) or a < last:
                    return _merged_by_python(slices, rest)
                last = a
    k = i + 1
    while k < ns:  # the slices after the last flow event (slices[i] is checked): checked too
        if not _as_double(_f(slices[k], O_TS, "ts"), &a) or a < last:
            return _merged_by_python(slices, rest)
        last = a
        k += 1
    seq.extend(slices[i:])
    seq.extend(rest[j:])
    return seq


@cython.no_gc  # bytes and numbers only, no cycle: not tracked (a tracked one made a gen-0 pass per 700)
@cython.final
cdef class Slice:
    """:class:`._pftrace_sink.OpenSlice` as a C struct: the same attributes, read and written by the
    writer's Python methods by name and by :func:`write_thread` directly. A writer whose threads are
    written here makes all its stack entries of this type (``FusedWriter._slice_type``).

    Its times are fixed when it is made; when both are floats (the fused fast path's) their doubles are
    kept beside them (``exact``), so that :func:`write_thread` compares them in C, as Python would."""

    cdef public object track, body, flows, end_flows
    cdef public bint is_b
    cdef readonly object start_ns, end_ns
    cdef double ds, de
    cdef bint exact

    def __init__(self, track, start_ns, end_ns, body, is_b):
        self.track, self.is_b = track, is_b
        self.start_ns, self.end_ns = start_ns, end_ns
        self.exact = type(start_ns) is float and type(end_ns) is float
        if self.exact:
            self.ds, self.de = PyFloat_AS_DOUBLE(start_ns), PyFloat_AS_DOUBLE(end_ns)
        self.body = body
        self.flows = b""
        self.end_flows = b""


cdef inline bint _starts_before(Slice s, object ts, bint tsf, double tsd, bint or_at) except -1:
    """``s.start_ns <= ts`` (``or_at``) or ``<``: in C when both are floats, else by Python."""
    if tsf and s.exact:
        return s.ds <= tsd if or_at else s.ds < tsd
    return (s.start_ns <= ts) if or_at else (s.start_ns < ts)


cdef object _NO_CAT = object()  # the last flow's (cat, name): nothing equals it before the first


def write_thread(w, key, list seq, event_dict, decode_raw_args, py_compact):
    """:meth:`.pftrace_fused.FusedWriter._write_thread` for writer ``w`` (see there for what and why),
    each slice's args compacted first as :func:`.pftrace_fused.compact_args` does (``py_compact``:
    msgspec's, for a text with ``\\u`` escapes).

    Times that are floats (the fused fast path's) are compared as doubles, which is what Python does
    with them; any other time is compared by Python."""
    pid, tid = key
    th = w._threads.get((pid, tid)) or w._thread(pid, tid)
    cdef list stack = th.stack
    cdef bytes track = th.track
    stats = w.stats
    cdef dict names = w._names
    cdef dict cats = w._cats
    cdef dict arg_names = w._arg_names
    cdef list new_interned = w._new_interned
    cdef list waiting = th.waiting
    cdef bytes seq_needs = w._seq_needs
    cdef dict salts = w._flow_salts
    cdef bytearray buf = w._buf
    cdef bytes end_body = _END + track
    cdef bytes begin_head = _BEGIN + track
    cdef Py_ssize_t slices = 0, flow_endpoints = 0
    cdef unsigned long long fid_u, ident_u
    cdef object unset = _UNSET
    cdef Slice top, entry, last
    cdef str ph
    cdef object e, ts, d, end, te, body, name, cat, ref, a, aref, ident, salt
    cdef object fid, enc, args, cref
    cdef object lcat = _NO_CAT, lname = _NO_CAT, lsalt = None
    cdef bint is_f, tsf, endf, c
    cdef double tsd = 0, endd = 0
    stats.events += len(seq)
    for e in seq:
        ph = _f(e, O_PH, "ph")
        ts = _f(e, O_TS, "ts")
        tsf = type(ts) is float
        if tsf:
            tsd = PyFloat_AS_DOUBLE(ts)
        if ph == "X":
            a = _f(e, O_ARGS, "args")
            if a is not unset and type(a) is not bytes:
                a = _compact_one(e, a, py_compact)
            d = _f(e, O_DUR, "dur")
            if tsf and type(d) is float:
                if PyFloat_AS_DOUBLE(d) > 0:
                    endd = tsd + PyFloat_AS_DOUBLE(d)
                    end = PyFloat_FromDouble(endd)
                else:
                    endd, end = tsd, ts
                endf = True
            else:
                end = ts + d if d > 0 else ts
                endf = tsf and type(end) is float
                if endf:
                    endd = PyFloat_AS_DOUBLE(end)
            if stack:
                top = stack[-1]
                if endf and top.exact:  # (endf: ts is a float too)
                    c = tsd < top.ds or (
                        tsd == top.ds and top.ds <= top.de and top.de < endd and top.body is not None
                        and not top.is_b
                    )
                else:
                    c = ts < top.start_ns or (
                        ts == top.start_ns <= top.end_ns < end and top.body is not None and not top.is_b
                    )
                if c:  # not in the merge's order: the dict writer knows what to do
                    w._begin(event_dict(e), ts, end, False)
                    continue
                while stack:  # _settle: end what is over (a zero-length slice holds its ns)
                    top = stack[-1]
                    te = top.end_ns
                    if tsf and top.exact:
                        if not (top.de < tsd or (top.ds < top.de and top.de == tsd)):
                            break
                    elif not (te < ts or top.start_ns < te == ts):
                        break
                    stack.pop()
                    slices += 1
                    body = top.body
                    if PyList_GET_SIZE(new_interned) or not w._cleared or (top.end_flows and te < 0):
                        if body is not None:
                            w._write_begin(top)
                        w._event(te, _END + track + top.end_flows)
                        continue
                    if body is not None:  # a leaf: its BEGIN, held back until now, then its END
                        _write_event(buf, top.start_ns, seq_needs, begin_head, body, top.flows)
                    # the END, with the flows that met a BEGIN already written
                    _write_event(buf, te, seq_needs, end_body, top.end_flows, b"")
                if stack:
                    top = stack[-1]
                    body = top.body
                    if body is not None:  # a parent: its BEGIN goes before its first child's
                        if PyList_GET_SIZE(new_interned) or not w._cleared:
                            w._write_begin(top)
                        else:
                            top.body = None
                            _write_event(buf, top.start_ns, seq_needs, begin_head, body, top.flows)
                    c = (endd > top.de) if (endf and top.exact) else (end > top.end_ns)
                    if c and not top.is_b:
                        stats.drop("overlapping_slice")  # the JSON importer drops these too
                        continue
            name = _f(e, O_NAME, "name")
            if name is unset:
                name = ""
            ref = names.get(name) or w._intern_name(name)
            cat = _f(e, O_CAT, "cat")
            cref = None
            if cat is not unset and cat:
                cref = cats.get(cat) or w._intern_cat(cat)
            if a is not unset and type(a) is bytes:  # compacted above: a non-empty object
                aref = arg_names.get("args") or w._intern(arg_names, "args", 3, 1)
                ref = _slice_body(ref, cref, aref, a)
            else:
                ref = _slice_body(ref, cref, None, None) if cref is not None else ref
                if a is not unset:
                    args = decode_raw_args(e)  # \u escapes: lone surrogates need the writer's care
                    if args:
                        ref = ref + w._annotations(args)
            entry = Slice.__new__(Slice)
            entry.track = track
            entry.start_ns = ts
            entry.end_ns = end
            entry.exact = endf
            entry.ds = tsd
            entry.de = endd
            entry.is_b = False
            entry.body = ref
            entry.end_flows = b""
            if waiting:
                entry.flows = b"".join([_K_TERM + _pack(PyLong_AsUnsignedLongLongMask(f)) for f in waiting])
                waiting.clear()
            else:
                entry.flows = b""
            if _f(e, O_BIND, "bind_id") is not unset:
                entry.flows += w._v2_flows(event_dict(e))
            stack.append(entry)
            continue
        # a v1 flow event: _flow_v1 (no fan-out here: such threads take the dict writer)
        ident = _f(e, O_ID, "id")
        cat = _f(e, O_CAT, "cat")
        if cat is unset:
            cat = ""
        name = _f(e, O_NAME, "name")
        if name is unset:
            name = ""
        if type(cat) is str and type(name) is str and cat == lcat and name == lname:
            salt = lsalt  # a flow's salt depends on its (cat, name) only: the last one's, again
        else:
            salt = salts.get((cat, name))
            if salt is not None and type(cat) is str and type(name) is str:
                lcat, lname, lsalt = cat, name, salt
        if salt is None or type(ident) is not int or not 0 <= ident < _TWO63:
            fid = w._flow_id(cat or "", name or "", None if ident is unset else ident)
        else:
            ident_u = PyLong_AsUnsignedLongLongMask(ident)
            fid_u = ((ident_u * _GOLDEN) ^ PyLong_AsUnsignedLongLongMask(salt)) & _MASK63
            fid = fid_u if fid_u else 1
        flow_endpoints += 1
        is_f = ph == "f"
        if is_f and _f(e, O_BP, "bp") != "e":
            waiting.append(fid)  # binds to the next slice that begins on this thread
            continue
        enc = (_K_TERM if is_f else _K_FLOW) + _pack(PyLong_AsUnsignedLongLongMask(fid))
        if stack:
            last = stack[-1]
            if _starts_before(last, ts, tsf, tsd, True):
                if is_f and (last.body is None or _starts_before(last, ts, tsf, tsd, False)):
                    last.end_flows += enc
                    continue
                if last.body is not None:
                    last.flows += enc
                    continue
            elif is_f:
                stats.drop("flow_no_enclosing_slice")
                continue
        elif is_f:
            stats.drop("flow_no_enclosing_slice")
            continue
        w._settle(th, ts)
        w._event(ts, _INSTANT + track + w._common(event_dict(e)) + enc)
        stats.flow_instants += 1
    stats.slices += slices
    stats.flow_endpoints += flow_endpoints


def write_counters(w, list events, decode_raw_args):
    """``FusedWriter._write_generic`` for a batch of counter (``C``) events only, without a dict per
    event: :meth:`.pftrace.PftraceWriter.write` and ``_counter``, one packet per numeric arg."""
    stats = w.stats
    cdef dict tracks = w._tracks
    cdef list new_interned = w._new_interned
    cdef bytes seq_needs = w._seq_needs
    cdef bytearray buf = w._buf
    cdef object unset = _UNSET
    cdef object e, pid, name, cid, prefix, args, key, value, ts_ns, track, body, k
    for e in events:
        if w._closed:
            raise ValueError("pftrace: write() after close()")
        stats.events += 1
        if w._interned >= w._intern_limit:
            w._reset_interning()
        ts_ns = int(_f(e, O_TS, "ts"))
        pid = _f(e, O_PID, "pid")
        name = _f(e, O_NAME, "name")
        name = "" if name is unset else str(name)
        cid = _f(e, O_ID, "id")
        if cid is unset:
            cid = None
        prefix = name if cid is None else f"{name} id: {cid}"
        args = decode_raw_args(e) if _f(e, O_ARGS, "args") is not unset else None
        if not args:
            continue
        for key, value in args.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                stats.drop("counter_not_a_number")
                continue
            k = ("counter", pid, prefix, key)
            track = tracks.get(k)
            if track is None:
                track = w._child_track(k, pid, f"{prefix} {key}", True)
            body = _COUNTER + track + _K_DOUBLE + pack_double(float(value))
            if PyList_GET_SIZE(new_interned) or not w._cleared or ts_ns < 0:
                w._event(ts_ns, body)
            else:
                _write_event(buf, ts_ns, seq_needs, body, b"", b"")
            stats.counters += 1
