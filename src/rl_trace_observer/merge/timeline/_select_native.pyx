# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of :func:`.select.pick_python`: the same events, read from an ``Event``'s slots (the
offsets its member descriptors hold) instead of by name; anything that is not exactly an ``Event``
is asked by name, as Python would."""

from cpython.ref cimport PyObject

from msgspec import UNSET

from .model import Event


cdef extern from *:
    """
    #ifndef RL_TRACE_SOURCE_SHA256
    #define RL_TRACE_SOURCE_SHA256 ""
    #endif
    #include "structmember.h"
    static inline PyObject* rl_slot(PyObject* o, Py_ssize_t off) { return *(PyObject**)((char*)o + off); }
    static inline Py_ssize_t rl_member_offset(PyObject* d) { return ((PyMemberDescrObject*)d)->d_member->offset; }
    """
    const char* RL_TRACE_SOURCE_SHA256
    PyObject* rl_slot(PyObject* o, Py_ssize_t off) noexcept
    Py_ssize_t rl_member_offset(PyObject* d) noexcept

SOURCE_SHA256 = (<bytes>RL_TRACE_SOURCE_SHA256).decode("ascii")


def _offset(name):
    descr = Event.__dict__[name]
    if type(descr).__name__ != "member_descriptor":
        raise ImportError(f"Event.{name} is not a slot")
    return rl_member_offset(<PyObject*>descr)


cdef Py_ssize_t O_PH = _offset("ph"), O_CAT = _offset("cat")
cdef dict _OFFSETS = {name: _offset(name) for name in ("ts", "dur", "args", "id")}
cdef object _EVENT = Event
cdef object _UNSET = UNSET


cdef inline object _field(object e, Py_ssize_t off, str name):
    cdef PyObject* v
    if type(e) is _EVENT:
        v = rl_slot(<PyObject*>e, off)
        if v != NULL:
            return <object>v
    return getattr(e, name)  # another type, or a deleted field: Python's own lookup (and error)


cdef inline bint _same_text(object v, str text):
    """``v == text``, with exact strings compared as strings (no rich-comparison call)."""
    if v is text:
        return True
    if type(v) is str:
        return <str>v == text
    return bool(v == text)


cdef inline bint _in(object v, tuple texts, object cats):
    """``v in cats``; an exact string is compared with ``texts`` (``cats`` when it is a few strings)."""
    cdef Py_ssize_t k
    if texts is None or type(v) is not str:
        return v in cats
    for k in range(len(texts)):
        if _same_text(v, <str>texts[k]):
            return True
    return False


def pick(events, str ph, cats, tuple need):
    """:func:`.select.pick_python`, compiled."""
    cdef Py_ssize_t offs[4]
    cdef Py_ssize_t n_need = len(need), j
    cdef list out = []
    cdef tuple texts = None
    cdef object e
    cdef bint ok
    if n_need > 4:
        raise ValueError("pick: at most 4 fields")
    for j in range(n_need):
        offs[j] = _OFFSETS[need[j]]
    if cats is not None and len(cats) <= 4 and all(type(c) is str for c in cats):
        texts = tuple(cats)  # a string is in a few strings when it equals one: compared, not hashed
    for e in events:
        if not _same_text(_field(e, O_PH, "ph"), ph):
            continue
        if cats is not None and not _in(_field(e, O_CAT, "cat"), texts, cats):
            continue
        ok = True
        for j in range(n_need):
            if _field(e, offs[j], need[j]) is _UNSET:
                ok = False
                break
        if ok:
            out.append(e)
    return out
