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
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_AsUnsignedLongLongMask
from libc.string cimport memcpy

from msgspec import UNSET

from ._pbwire import varint
from ._pftrace_sink import BEGIN, END, INSTANT, K_FLOW, K_TERMINATING, OpenSlice

cdef object _UNSET = UNSET
cdef object new_slice = OpenSlice.__new__
cdef bytes _BEGIN = BEGIN
cdef bytes _END = END
cdef bytes _INSTANT = INSTANT
cdef bytes _K_FLOW = K_FLOW
cdef bytes _K_TERM = K_TERMINATING
cdef bytes _K_ANNOTATION = b"\x22"
cdef bytes _DA_LEGACY_JSON = b"\x4a"
cdef unsigned long long _GOLDEN = 0x9E3779B97F4A7C15ULL
cdef unsigned long long _MASK63 = 0x7FFFFFFFFFFFFFFFULL
cdef object _TWO63 = int("9223372036854775808")


cdef inline void _put(bytearray buf, const char* p, Py_ssize_t n) except *:
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buf)
    PyByteArray_Resize(buf, size + n)
    memcpy(PyByteArray_AS_STRING(buf) + size, p, n)


cdef inline void _put_bytes(bytearray buf, bytes b) except *:
    _put(buf, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))


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


cdef void _write_begin(bytearray buf, object start, bytes seq_needs, bytes begin_head, bytes body,
                       bytes flows) except *:
    """One BEGIN packet: timestamp, sequence fields, track event (type, track, body, flows)."""
    cdef unsigned char head[40]
    cdef unsigned char tv[10]
    cdef int ntv = _ts_varint(start, tv)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(begin_head) + PyBytes_GET_SIZE(body) + PyBytes_GET_SIZE(flows)
    cdef unsigned char nv[10]
    cdef int nnv = _uvarint(nv, <unsigned long long>n)
    cdef Py_ssize_t total = 1 + ntv + PyBytes_GET_SIZE(seq_needs) + 1 + nnv + n
    cdef int k = 0
    head[0] = 0x0A
    k = 1 + _uvarint(head + 1, <unsigned long long>total)
    head[k] = 0x40
    k += 1
    memcpy(head + k, tv, ntv)
    k += ntv
    _put(buf, <char*>head, k)
    _put_bytes(buf, seq_needs)
    k = 0
    head[0] = 0x5A
    memcpy(head + 1, nv, nnv)
    _put(buf, <char*>head, 1 + nnv)
    _put_bytes(buf, begin_head)
    _put_bytes(buf, body)
    _put_bytes(buf, flows)


cdef void _write_end(bytearray buf, object te, bytes end_tail) except *:
    cdef unsigned char head[24]
    cdef unsigned char tv[10]
    cdef int ntv = _ts_varint(te, tv)
    cdef int k
    head[0] = 0x0A
    k = 1 + _uvarint(head + 1, <unsigned long long>(1 + ntv + PyBytes_GET_SIZE(end_tail)))
    head[k] = 0x40
    k += 1
    memcpy(head + k, tv, ntv)
    k += ntv
    _put(buf, <char*>head, k)
    _put_bytes(buf, end_tail)


cdef inline bytes _pack(unsigned long long f):
    cdef unsigned char b[8]
    cdef int i
    for i in range(8):
        b[i] = <unsigned char>(f & 0xFF)
        f >>= 8
    return (<char*>b)[:8]


cdef bytes _ld(bytes tag, bytes payload):
    cdef unsigned char nv[10]
    cdef int n = _uvarint(nv, <unsigned long long>PyBytes_GET_SIZE(payload))
    return tag + (<char*>nv)[:n] + payload


def write_thread(w, key, list seq, event_dict, decode_raw_args):
    """:meth:`.pftrace_fused.FusedWriter._write_thread` for writer ``w`` (see there for what and why)."""
    pid, tid = key
    th = w._threads.get((pid, tid)) or w._thread(pid, tid)
    cdef list stack = th.stack
    cdef bytes track = th.track
    stats = w.stats
    cdef dict names = w._names
    cdef dict cats = w._cats
    cdef dict arg_names = w._arg_names
    cdef list new_interned = w._new_interned
    cdef bytes seq_needs = w._seq_needs
    cdef dict salts = w._flow_salts
    cdef bytearray buf = w._buf
    cdef bytes end_body = _END + track
    cdef bytes end_tail = seq_needs + b"\x5a" + _ld(b"", end_body)
    cdef bytes begin_head = _BEGIN + track
    cdef Py_ssize_t slices = 0
    cdef unsigned long long fid_u, ident_u
    cdef object unset = _UNSET
    cdef object e, ph, ts, d, end, top, te, body, name, cat, ref, a, aref, ann, entry, ident, salt
    cdef object fid, enc, last, args
    cdef bint is_f
    stats.events += len(seq)
    for e in seq:
        ph = e.ph
        ts = e.ts
        if ph == "X":
            d = e.dur
            end = ts + d if d > 0 else ts
            if stack:
                top = stack[-1]
                if ts < top.start_ns or (
                    ts == top.start_ns <= top.end_ns < end and top.body is not None and not top.is_b
                ):
                    w._begin(event_dict(e), ts, end, False)
                    continue
                while stack:
                    top = stack[-1]
                    te = top.end_ns
                    if not (te < ts or top.start_ns < te == ts):
                        break
                    stack.pop()
                    slices += 1
                    body = top.body
                    if PyList_GET_SIZE(new_interned) or not w._cleared or top.end_flows:
                        if body is not None:
                            w._write_begin(top)
                        w._event(te, _END + track + top.end_flows)
                        continue
                    if body is not None:  # a leaf: its BEGIN, held back until now, then its END
                        _write_begin(buf, top.start_ns, seq_needs, begin_head, body, top.flows)
                    _write_end(buf, te, end_tail)
                if stack:
                    top = stack[-1]
                    body = top.body
                    if body is not None:  # a parent: its BEGIN goes before its first child's
                        if PyList_GET_SIZE(new_interned) or not w._cleared:
                            w._write_begin(top)
                        else:
                            top.body = None
                            _write_begin(buf, top.start_ns, seq_needs, begin_head, body, top.flows)
                    if end > top.end_ns and not top.is_b:
                        stats.drop("overlapping_slice")
                        continue
            name = e.name
            if name is unset:
                name = ""
            ref = names.get(name) or w._intern_name(name)
            cat = e.cat
            if cat is not unset and cat:
                ref = ref + (cats.get(cat) or w._intern_cat(cat))
            a = e.args
            if a is not unset:
                if type(a) is bytes:  # compacted by compact_args: a non-empty object
                    aref = arg_names.get("args") or w._intern(arg_names, "args", 3, 1)
                    ann = _ld(aref + _DA_LEGACY_JSON, a)
                    ref = ref + _ld(_K_ANNOTATION, ann)
                else:
                    args = decode_raw_args(e)
                    if args:
                        ref = ref + w._annotations(args)
            entry = new_slice(OpenSlice)  # OpenSlice(track, ts, end, ref, False) without its __init__ frame
            entry.track = track
            entry.start_ns = ts
            entry.end_ns = end
            entry.is_b = False
            entry.body = ref
            entry.flows = b""
            entry.end_flows = b""
            if th.waiting:
                entry.flows = b"".join([_K_TERM + _pack(PyLong_AsUnsignedLongLongMask(f)) for f in th.waiting])
                th.waiting.clear()
            if e.bind_id is not unset:
                entry.flows += w._v2_flows(event_dict(e))
            stack.append(entry)
            continue
        # a v1 flow event
        ident = e.id
        cat = e.cat if e.cat is not unset else ""
        name = e.name if e.name is not unset else ""
        salt = salts.get((cat, name))
        if salt is None or type(ident) is not int or not 0 <= ident < _TWO63:
            fid = w._flow_id(cat or "", name or "", None if ident is unset else ident)
        else:
            ident_u = PyLong_AsUnsignedLongLongMask(ident)
            fid_u = ((ident_u * _GOLDEN) ^ PyLong_AsUnsignedLongLongMask(salt)) & _MASK63
            fid = fid_u if fid_u else 1
        stats.flow_endpoints += 1
        is_f = ph == "f"
        if is_f and e.bp != "e":
            th.waiting.append(fid)
            continue
        enc = (_K_TERM if is_f else _K_FLOW) + _pack(PyLong_AsUnsignedLongLongMask(fid))
        last = stack[-1] if stack else None
        if last is not None and last.start_ns <= ts:
            if is_f and (last.body is None or last.start_ns < ts):
                last.end_flows += enc
                continue
            if last.body is not None:
                last.flows += enc
                continue
        elif is_f:
            stats.drop("flow_no_enclosing_slice")
            continue
        w._settle(th, ts)
        w._event(ts, _INSTANT + track + w._common(event_dict(e)) + enc)
        stats.flow_instants += 1
    stats.slices += slices
