# cython: language_level=3, boundscheck=False, wraparound=False
"""Chrome JSON pieces encoded in C: :func:`.chrome_json.encode_pieces`'s msgspec encode of the merged
events, byte for byte.

Why: msgspec walks all 17 fields of every ``Event`` through its generic struct encoder (~11 % of a
``.json.gz`` merge's CPU); here each field is read from its slot and written by its type. Only the
cases whose bytes are certain are written here: ASCII text that needs no escape, ints that fit 64
bits, ``Raw`` args copied as they are, booleans, and the merge's times — doubles that are a whole
number of ns / 1000 (every time the merge writes), whose shortest repr (msgspec's) is those digits
with at most 3 decimals. Any other event (an escape, a non-ASCII name, a float of another kind, a
subclass) is encoded by the ``fallback`` msgspec encoder, whole: the output never depends on which
path ran, and ``tests/merge/test_chrome_json_native.py`` holds both to the same bytes.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.ref cimport PyObject
from libc.math cimport isfinite, nearbyint
from libc.limits cimport LLONG_MIN
from libc.string cimport memcpy

from msgspec import UNSET, Raw

from rl_trace_observer.merge.timeline.model import Event

cdef extern from *:
    """
    #ifndef RL_TRACE_SOURCE_SHA256
    #define RL_TRACE_SOURCE_SHA256 ""
    #endif
    #include "structmember.h"
    static inline PyObject* rl_slot(PyObject* o, Py_ssize_t off) { return *(PyObject**)((char*)o + off); }
    static inline Py_ssize_t rl_member_offset(PyObject* d) { return ((PyMemberDescrObject*)d)->d_member->offset; }
    static inline int rl_signbit(double v) { return signbit(v) != 0; }
    /* msgspec.Raw's fields as msgspec 0.18-0.23 lay them out; checked against the buffer protocol at
       import (_raw_layout_holds), the buffer protocol is used where they do not hold */
    typedef struct { PyObject_HEAD PyObject* base; char* buf; Py_ssize_t len; } rl_raw;
    static inline const char* rl_raw_buf(PyObject* o) { return ((rl_raw*)o)->buf; }
    static inline Py_ssize_t rl_raw_len(PyObject* o) { return ((rl_raw*)o)->len; }
    """
    const char* RL_TRACE_SOURCE_SHA256
    PyObject* rl_slot(PyObject* o, Py_ssize_t off) noexcept
    Py_ssize_t rl_member_offset(PyObject* d) noexcept
    int rl_signbit(double v) noexcept
    const char* rl_raw_buf(PyObject* o) noexcept
    Py_ssize_t rl_raw_len(PyObject* o) noexcept
    PyTypeObject* Py_TYPE(PyObject* o) noexcept
    PyTypeObject PyUnicode_Type
    PyTypeObject PyLong_Type
    PyTypeObject PyFloat_Type
    PyObject* Py_True
    PyObject* Py_False
    double PyFloat_AS_DOUBLE(PyObject* o) noexcept
    int rl_resize "PyByteArray_Resize"(PyObject* o, Py_ssize_t n) noexcept
    int PyUnicode_IS_COMPACT_ASCII(PyObject* o) noexcept
    Py_ssize_t PyUnicode_GET_LENGTH(PyObject* o) noexcept
    void* PyUnicode_DATA(PyObject* o) noexcept
    long long PyLong_AsLongLongAndOverflow(PyObject* o, int* overflow) except? -1

SOURCE_SHA256 = (<bytes>RL_TRACE_SOURCE_SHA256).decode("ascii")

cdef enum:
    NFIELDS = 17
cdef Py_ssize_t _offsets[NFIELDS]
cdef bytes _keys = b""  # '"ph":"name":...' concatenated; _key_at / _key_len index it
cdef Py_ssize_t _key_at[NFIELDS]
cdef Py_ssize_t _key_len[NFIELDS]
cdef PyObject* _unset = <PyObject*>UNSET
cdef PyTypeObject* _event_type = <PyTypeObject*>Event
cdef PyTypeObject* _raw_type = <PyTypeObject*>Raw
cdef double _LIMIT = 140737488355328.0  # 2**47 ns: below it y / 1000 prints as y's digits (module doc)


def _layout():
    """Each field's slot offset (its member descriptor's) and its key, in the struct's (output) order."""
    global _keys
    fields = Event.__struct_fields__
    if len(fields) != NFIELDS:
        raise ImportError(f"Event has {len(fields)} fields, this twin was written for {NFIELDS}")
    keys = []
    at = 0
    for i, name in enumerate(fields):
        descr = Event.__dict__[name]
        if type(descr).__name__ != "member_descriptor":
            raise ImportError(f"Event.{name} is not a slot")
        _offsets[i] = rl_member_offset(<PyObject*>descr)
        key = b'"' + name.encode() + b'":'
        _key_at[i], _key_len[i] = at, len(key)
        at += len(key)
        keys.append(key)
    if Event.__struct_defaults__[0] != "" or any(d is not UNSET for d in Event.__struct_defaults__[1:]):
        raise ImportError("Event's defaults are not those this twin omits")
    _keys = b"".join(keys)


_layout()


def _raw_layout_holds():
    """Whether a ``Raw``'s bytes can be read from its fields (faster than the buffer protocol)."""
    import msgspec

    cdef Py_buffer view
    samples = [Raw(b'{"a": 1}'), msgspec.json.decode(b'[{"b": [1, 2]}, 7]', type=list[Raw])[0]]
    for r in samples:
        PyObject_GetBuffer(r, &view, PyBUF_SIMPLE)
        same = view.buf == <void*>rl_raw_buf(<PyObject*>r) and view.len == rl_raw_len(<PyObject*>r)
        PyBuffer_Release(&view)
        if not same:
            return False
    return True


cdef bint _raw_fields = _raw_layout_holds()


cdef inline int _ensure(bytearray buf, Py_ssize_t* cap, Py_ssize_t need) noexcept:
    """Capacity for ``need`` bytes; -1 (MemoryError set) when it cannot grow."""
    cdef Py_ssize_t want
    if need <= cap[0]:
        return 0
    want = cap[0] + cap[0] // 2
    if want < need:
        want = need
    if rl_resize(<PyObject*>buf, want) < 0:
        return -1
    cap[0] = want
    return 0


cdef inline char* _room(bytearray buf, Py_ssize_t* cap, Py_ssize_t used, Py_ssize_t n) except NULL:
    """Room for ``n`` more bytes after ``used``; ``buf``'s size is the capacity, trimmed at the end."""
    if _ensure(buf, cap, used + n) < 0:
        return NULL
    return PyByteArray_AS_STRING(buf) + used


cdef const char* _PAIRS = (
    b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    b"40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    b"8081828384858687888990919293949596979899"
)


cdef inline int _digits(char* p, unsigned long long v) noexcept:
    """``v`` in decimal at ``p``, two digits per division; returns the length."""
    cdef char tmp[24]
    cdef int n = 24, k
    cdef unsigned long long r
    while v >= 100:
        r = v % 100
        v //= 100
        n -= 2
        tmp[n] = _PAIRS[2 * r]
        tmp[n + 1] = _PAIRS[2 * r + 1]
    if v >= 10:
        n -= 2
        tmp[n] = _PAIRS[2 * v]
        tmp[n + 1] = _PAIRS[2 * v + 1]
    else:
        n -= 1
        tmp[n] = <char>(48 + v)
    k = 24 - n
    memcpy(p, tmp + n, k)
    return k


cdef inline int _time(char* p, double v) noexcept:
    """``v``'s shortest repr when ``v`` is a whole number of ns / 1000 within 2**47 ns; else -1."""
    cdef double t
    cdef long long y
    cdef unsigned long long a, frac
    cdef int n = 0
    if not isfinite(v):
        return -1
    t = nearbyint(v * 1000.0)
    if not (-_LIMIT < t < _LIMIT):
        return -1
    y = <long long>t
    if <double>y / 1000.0 != v or (y == 0 and rl_signbit(v)):
        return -1
    if y < 0:
        p[0] = 45
        n = 1
        a = <unsigned long long>(-y)
    else:
        a = <unsigned long long>y
    frac = a % 1000
    n += _digits(p + n, a // 1000)
    p[n] = 46
    n += 1
    if frac == 0:
        p[n] = 48
        return n + 1
    p[n] = <char>(48 + frac // 100)
    p[n + 1] = <char>(48 + frac // 10 % 10)
    p[n + 2] = <char>(48 + frac % 10)
    n += 3
    while p[n - 1] == 48:
        n -= 1
    return n


cdef inline bint _plain_ascii(const unsigned char* s, Py_ssize_t n) noexcept:
    """True when msgspec writes the text as is: no quote, backslash or control character."""
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(n):
        c = s[i]
        if c < 0x20 or c == 0x22 or c == 0x5C or c >= 0x7F:
            return False
    return True


cdef Py_ssize_t _event(bytearray buf, Py_ssize_t* cap, Py_ssize_t used, PyObject* e) except -2:
    """One event's JSON after ``used``: its new end, or -1 when only msgspec can say its bytes."""
    cdef Py_ssize_t i, n, klen
    cdef PyObject* v
    cdef PyTypeObject* t
    cdef char* p
    cdef const char* keys = PyBytes_AS_STRING(_keys)
    cdef bint first = True
    cdef long long iv
    cdef int overflow = 0, m
    cdef Py_buffer view
    cdef const char* src
    if Py_TYPE(e) != _event_type:
        return -1
    p = _room(buf, cap, used, 1)
    p[0] = 123  # {
    used += 1
    for i in range(NFIELDS):
        v = rl_slot(e, _offsets[i])
        if v == NULL:
            return -1
        if v == _unset:
            continue
        t = Py_TYPE(v)
        klen = _key_len[i] + (0 if first else 1)
        if t == &PyUnicode_Type:
            if not PyUnicode_IS_COMPACT_ASCII(v):
                return -1
            n = PyUnicode_GET_LENGTH(v)
            if i == 0 and n == 0:  # ph "" is its default: omitted
                continue
            if not _plain_ascii(<const unsigned char*>PyUnicode_DATA(v), n):
                return -1
            p = _room(buf, cap, used, klen + n + 2)
            if not first:
                p[0] = 44
                p += 1
            memcpy(p, keys + _key_at[i], _key_len[i])
            p += _key_len[i]
            p[0] = 34
            memcpy(p + 1, PyUnicode_DATA(v), n)
            p[n + 1] = 34
            used += klen + n + 2
        elif t == &PyFloat_Type:
            p = _room(buf, cap, used, klen + 32)
            m = _time(p + klen, PyFloat_AS_DOUBLE(v))
            if m < 0:
                return -1
            if not first:
                p[0] = 44
                p += 1
            memcpy(p, keys + _key_at[i], _key_len[i])
            used += klen + m
        elif t == &PyLong_Type:
            iv = PyLong_AsLongLongAndOverflow(v, &overflow)
            if overflow or iv == LLONG_MIN:
                return -1
            p = _room(buf, cap, used, klen + 21)
            if not first:
                p[0] = 44
                p += 1
            memcpy(p, keys + _key_at[i], _key_len[i])
            p += _key_len[i]
            m = 0
            if iv < 0:
                p[0] = 45
                m = 1
                m += _digits(p + 1, <unsigned long long>(-iv))
            else:
                m = _digits(p, <unsigned long long>iv)
            used += klen + m
        elif v == Py_True or v == Py_False:
            m = 4 if v == Py_True else 5
            p = _room(buf, cap, used, klen + m)
            if not first:
                p[0] = 44
                p += 1
            memcpy(p, keys + _key_at[i], _key_len[i])
            memcpy(p + _key_len[i], b"true" if v == Py_True else b"false", m)
            used += klen + m
        elif t == _raw_type:  # its bytes as they are: read from its fields, else by the buffer protocol
            if _raw_fields:
                src, n = rl_raw_buf(v), rl_raw_len(v)
            else:
                PyObject_GetBuffer(<object>v, &view, PyBUF_SIMPLE)
                src, n = <const char*>view.buf, view.len
            m = 0 if n > 0 and _ensure(buf, cap, used + klen + n) == 0 else (-1 if n <= 0 else -2)
            if m == 0:
                p = PyByteArray_AS_STRING(buf) + used
                if not first:
                    p[0] = 44
                    p += 1
                memcpy(p, keys + _key_at[i], _key_len[i])
                memcpy(p + _key_len[i], src, n)
            if not _raw_fields:
                PyBuffer_Release(&view)
            if m < 0:
                return m  # -1: msgspec's to write (empty); -2: the MemoryError is set
            used += klen + n
        else:
            return -1
        first = False
    p = _room(buf, cap, used, 1)
    p[0] = 125  # }
    return used + 1


def encode_piece(list events, fallback):
    """``events`` as one piece: ``b" e1,e2,...,en,\\n"`` (a bytearray), exactly as
    :func:`.chrome_json.encode_pieces` makes it from msgspec's ``[e1,...,en]``; ``fallback(e)`` is
    msgspec's encoding of one event, used for the events this loop does not write itself."""
    cdef Py_ssize_t count = PyList_GET_SIZE(events)
    cdef Py_ssize_t cap = 192 * count + 64  # grown by half when short
    cdef Py_ssize_t used = 1, end, j, n
    cdef bytearray buf = bytearray()
    cdef PyObject* e
    cdef bytes enc
    cdef char* p
    if count == 0:
        return bytearray(b" ,\n")  # msgspec's "[]", made a piece as encode_pieces does
    PyByteArray_Resize(buf, cap)  # not bytearray(cap): no need to zero what is written over
    PyByteArray_AS_STRING(buf)[0] = 32
    for j in range(count):
        e = PyList_GET_ITEM(events, j)
        end = _event(buf, &cap, used, e)
        if end < 0:
            enc = fallback(<object>e)
            n = PyBytes_GET_SIZE(enc)
            p = _room(buf, &cap, used, n)
            memcpy(p, PyBytes_AS_STRING(enc), n)
            end = used + n
        p = _room(buf, &cap, end, 1)
        p[0] = 44
        used = end + 1
    p = _room(buf, &cap, used, 1)
    p[0] = 10
    PyByteArray_Resize(buf, used + 1)
    return buf
