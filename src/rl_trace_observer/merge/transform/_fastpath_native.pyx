# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled twin of :func:`.fastpath.to_output`, typed: the same decisions, line for line, on C
doubles and an ``Event``'s slots instead of Python floats and attributes by name.

Why: compiled as it was written (Python's semantics: a float object per operation, a lookup by name
per field) the loop was ~30 % of a ``.json.gz`` merge's CPU; most of it went to boxing times and
reading fields. Here a file is walked twice: first every time is computed into C arrays without
touching an event, then the loop proper writes them. A file the typed route cannot take exactly — an
ns source, an object not exactly an ``Event``, a time or duration of an unexpected type, or one that
needs :mod:`.fastpath`'s exact integer route (far from the base, garbage, a long slice) — is left
untouched by the first walk and handed whole to :func:`.fastpath.to_output`, so the result is always
the Python loop's. ``tests/merge/test_native_twins.py`` merges random events with both to the same
bytes in every output format.

Within its route the arithmetic is Python's: ``y = (ts + q) * 1000 + r`` with the rounder added and
taken away in doubles (no fused multiply-add: ``setup.py`` builds with ``-ffp-contract=off``); every
value the comparisons see lies strictly within ±2**47 (times) or [0, 2**50) (durations), so a double
holds it exactly as Python's float does.
"""

from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_FromDouble
from cpython.long cimport PyLong_AsDouble
from cpython.ref cimport PyObject
from libc.stdlib cimport free, malloc, realloc

from msgspec import UNSET

from ..timeline.model import Event
from ..timeline.scopes import SCOPE_FLOW_CAT, SCOPE_FLOW_NAME
from ..timeline.times import KNOWN_PHASES
from . import fastpath as _py
from .flowspace import SCOPE_ID_MASK, FlowSpace, scope_ends
from .nesting import by_lane, to_overlap_tracks, us_to_exact_ns
from .outliers import SPREAD_NS, SpreadOut
from .passes import _SEQ_BITS, BAD_PID, BadIdentity, count_overlaps


cdef extern from *:
    """
    #ifndef RL_TRACE_SOURCE_SHA256
    #define RL_TRACE_SOURCE_SHA256 ""
    #endif
    #include "structmember.h"
    static inline PyObject* rl_slot(PyObject* o, Py_ssize_t off) { return *(PyObject**)((char*)o + off); }
    static inline void rl_set_slot(PyObject* o, Py_ssize_t off, PyObject* v) {
        PyObject** p = (PyObject**)((char*)o + off);
        PyObject* old = *p;
        Py_INCREF(v);
        *p = v;
        Py_XDECREF(old);
    }
    static inline Py_ssize_t rl_member_offset(PyObject* d) { return ((PyMemberDescrObject*)d)->d_member->offset; }
    """
    const char* RL_TRACE_SOURCE_SHA256
    PyObject* rl_slot(PyObject* o, Py_ssize_t off) noexcept
    void rl_set_slot(PyObject* o, Py_ssize_t off, PyObject* v) noexcept
    Py_ssize_t rl_member_offset(PyObject* d) noexcept

SOURCE_SHA256 = (<bytes>RL_TRACE_SOURCE_SHA256).decode("ascii")


def _offset(name):
    descr = Event.__dict__[name]
    if type(descr).__name__ != "member_descriptor":
        raise ImportError(f"Event.{name} is not a slot")
    return rl_member_offset(<PyObject*>descr)


# Event has gc=False: a field is set by storing into its slot, as its setattr does
if Event.__struct_config__.gc:
    raise ImportError("Event is tracked by the garbage collector: its slots cannot be written directly")

cdef Py_ssize_t O_PH = _offset("ph"), O_NAME = _offset("name"), O_CAT = _offset("cat")
cdef Py_ssize_t O_PID = _offset("pid"), O_TID = _offset("tid"), O_TS = _offset("ts")
cdef Py_ssize_t O_DUR = _offset("dur"), O_ID = _offset("id"), O_BIND = _offset("bind_id")
cdef Py_ssize_t O_BP = _offset("bp"), O_S = _offset("s"), O_ARGS = _offset("args")
cdef object _EVENT = Event
cdef object _UNSET = UNSET
cdef object _KNOWN = KNOWN_PHASES
cdef object _SCOPE_CAT = SCOPE_FLOW_CAT
cdef object _SCOPE_NAME = SCOPE_FLOW_NAME
cdef object _ZERO = 0

# what the first walk decided per event
cdef enum:
    K_SKIP = 0  # a metadata event: read by the format already
    K_BAD = 1  # an unknown phase, or no time: dropped, counted
    K_HOLD = 2  # a TokenSpeed scope flow start, held as it came
    K_TIME = 3  # timed; no duration
    K_SPAN = 4  # timed, with a duration

cdef double _ROUNDER = _py._ROUNDER
cdef double _EXACT = float(_py._EXACT_NS)
cdef double _FAST_DUR = float(_py._FAST_DUR)


cdef inline object _get(object e, Py_ssize_t off):
    cdef PyObject* v = rl_slot(<PyObject*>e, off)
    if v == NULL:  # a deleted field: fails the file as Python's lookup would
        raise AttributeError("an Event field was deleted")
    return <object>v


cdef inline void _put(object e, Py_ssize_t off, object v):
    rl_set_slot(<PyObject*>e, off, <PyObject*>v)


cdef tuple _close_chains(dict chains, long long links, long long unpaired, object fanned):
    """``FlowSpace.finish``'s count over the loop's v1 chains (one per flow), typed; it counts its own
    v2 binds."""
    cdef dict states
    cdef list st
    cdef long long c
    for states in chains.values():
        for st in states.values():
            c = st[3]
            if st[1] and c > 1:
                links += c - 1
                if c > 2 and fanned is not None:
                    fanned.add(st[0])
            else:
                unpaired += c
    return links, unpaired


cdef struct _Stack:
    double* v
    Py_ssize_t n, cap


cdef int _push(_Stack* s, double x) except -1:
    cdef double* grown
    if s.n == s.cap:
        grown = <double*>realloc(s.v, (s.cap * 2 + 16) * sizeof(double))
        if grown == NULL:
            raise MemoryError()
        s.v, s.cap = grown, s.cap * 2 + 16
    s.v[s.n] = x
    s.n += 1
    return 0


cdef class _Lane:
    """A merged thread's nesting state, ``fastpath``'s ``[mode, y, dur, end, stack, stack, first]``."""

    cdef int mode
    cdef double y, dn, end, first
    cdef _Stack s1, s2

    def __cinit__(self, int mode, double exact):
        self.mode, self.y, self.dn, self.end, self.first = mode, 0.0, 0.0, -exact, exact
        self.s1.v = self.s2.v = NULL
        self.s1.n = self.s1.cap = self.s2.n = self.s2.cap = 0

    def __dealloc__(self):
        free(self.s1.v)
        free(self.s2.v)

    cdef int push1(self, double v) except -1:
        return _push(&self.s1, v)

    cdef int push2(self, double v) except -1:
        return _push(&self.s2, v)

    cdef int nest_other(self, double y, double dn, double end) except -1:
        """``fastpath._nest_other`` for a lane's second slice (mode 4), which decides its order."""
        cdef double fy = self.y, fd = self.dn, fe = self.end
        if y < self.first:
            self.first = y
        if y > fy or (y == fy and dn <= fd):  # start order: replay the first slice, then this one
            self.push1(fe)
            while self.s1.n and self.s1.v[self.s1.n - 1] <= y:
                self.s1.n -= 1
            if self.s1.n and end > self.s1.v[self.s1.n - 1]:
                self.mode = 3
            else:
                self.push1(end)
                self.mode, self.y, self.dn = 1, y, dn
            return 0
        if end < fe:
            self.mode = 3
            return 0
        self.push1(fy)
        self.push2(fe)
        self.mode = 2
        while self.s1.n and self.s1.v[self.s1.n - 1] >= y:
            self.s1.n -= 1
            self.s2.n -= 1
        if self.s2.n and self.s2.v[self.s2.n - 1] > y:
            self.mode = 3
            return 0
        self.push1(y)
        self.push2(end)
        self.end = end
        return 0


cdef int _number(object v, double* out) except -1:
    """A float, or an int a double holds, as Python's arithmetic would convert it; 1: anything else
    (another type, an int too large: Python's route decides)."""
    if type(v) is float:
        out[0] = PyFloat_AS_DOUBLE(v)
        return 0
    if type(v) is int:
        try:
            out[0] = PyLong_AsDouble(v)
        except OverflowError:
            return 1
        return 0
    return 1


cdef int _times(list events, double q, double rr, double scale, double lower, object hold,
                unsigned char* kinds, double* ys, double* dns) except -1:
    """The first walk: each event's kind and times. 1: the typed route cannot take the file (nothing
    was changed); 0: done."""
    cdef Py_ssize_t i, n = len(events)
    cdef object e, ph, ts, d
    cdef double t, y, dn
    for i in range(n):
        e = events[i]
        if type(e) is not _EVENT:
            return 1
        ph = _get(e, O_PH)
        if ph != "X":
            if ph == "M":
                kinds[i] = K_SKIP
                continue
            if ph not in _KNOWN:
                kinds[i] = K_BAD
                continue
            if hold is not None and ph == "s" and _get(e, O_NAME) == _SCOPE_NAME and _get(e, O_CAT) == _SCOPE_CAT:
                kinds[i] = K_HOLD
                continue
        ts = _get(e, O_TS)
        if ts is _UNSET:
            kinds[i] = K_BAD  # ``UNSET + q``: Python's TypeError, counted
            continue
        if _number(ts, &t):
            return 1
        y = (t + q) * scale + rr - _ROUNDER
        if not (lower < y < _EXACT):
            return 1  # the exact integer route (far, early, NaN or garbage)
        ys[i] = y
        d = _get(e, O_DUR)
        if d is _UNSET:
            kinds[i] = K_TIME
            continue
        if _number(d, &t):
            return 1
        dn = t * scale + _ROUNDER - _ROUNDER
        if not (0.0 <= dn < _FAST_DUR):
            return 1  # a long slice (or NaN): Python's route
        dns[i] = dn
        kinds[i] = K_SPAN
    return 0


def to_output(events, result, *, source_ns, shift_ns, mapper, ctx, unit_ns=1000, hold=None,
              in_order=None, far=None, low_ns=-_py.MAX_TS_NS):
    """:func:`.fastpath.to_output`, typed (see the module's docstring)."""
    cdef Py_ssize_t n = len(events)
    cdef unsigned char* kinds = NULL
    cdef double* ys = NULL
    cdef double* dns = NULL
    if not source_ns and isinstance(events, list) and (unit_ns == 1000 or unit_ns == 1):
        q, rr, scale = _py._time_constants(shift_ns, False)
        lower = max(-_EXACT, float(low_ns))
        try:
            kinds = <unsigned char*>malloc(n + 1)
            ys = <double*>malloc((n + 1) * sizeof(double))
            dns = <double*>malloc((n + 1) * sizeof(double))
            if kinds == NULL or ys == NULL or dns == NULL:
                raise MemoryError()
            if not _times(events, q, rr, scale, lower, hold, kinds, ys, dns):
                return _loop(events, result, mapper, ctx, float(unit_ns), hold, in_order, kinds, ys, dns)
        finally:
            free(kinds)
            free(ys)
            free(dns)
    return _py.to_output(events, result, source_ns=source_ns, shift_ns=shift_ns, mapper=mapper, ctx=ctx,
                         unit_ns=unit_ns, hold=hold, in_order=in_order, far=far, low_ns=low_ns)


cdef object _loop(list events, object result, object mapper, object ctx, double k, object hold,
                  object in_order, unsigned char* kinds, double* ys, double* dns):
    """The second walk: the loop proper, with the times of the first (``fastpath.to_output``'s body)."""
    cdef Py_ssize_t i, n = len(events)
    cdef unsigned char kind
    cdef double y, dn, end, lo = _EXACT, hi = -_EXACT
    cdef Py_ssize_t bad = 0, no_pid = 0, n_s = 0, n_t = 0, n_f = 0
    cdef long long seq = 0, links = 0, unpaired = 0, linked = 0, unlinked = 0
    cdef int first_mode = 2 if mapper.reader.slice_order == "exit" else 0
    cdef bint is_x
    cdef _Lane lane = None, prev_lane = None, state
    cdef list out = [], st, early = []
    cdef dict counts = {}, by_tid = {}, lanes = {}, chains = {}, chain = {}
    cdef set unsure = set()
    cdef object e, ph, pid, tid, fid, cat, name, found, mpid, mtid, m_pid, m_tid, key
    cdef object last_pid = _py._NO_LANE, last_tid = _py._NO_LANE  # (fastpath: no lane yet)
    cdef object prev_pid = _py._NO_LANE, prev_tid = _py._NO_LANE
    cdef object prev_mpid = _ZERO, prev_mtid = _ZERO
    cdef object lcat = _py._NO_CHAIN, lname = _py._NO_CHAIN
    cdef object global_pid = mapper.owner_merged
    cdef object space = FlowSpace(ctx)
    cdef object viz_scopes = space.viz_scopes
    cdef object scope_prefix = space.scope_prefix(), scope_mask = SCOPE_ID_MASK
    cdef object base = ctx.namespace << _SEQ_BITS
    cdef list scoped = [] if ctx.collect_scopes else None
    mpid = mtid = _ZERO
    for i in range(n):
        kind = kinds[i]
        if kind == K_SKIP:
            continue
        e = events[i]
        if kind == K_BAD:
            bad += 1
            continue
        if kind == K_HOLD:
            hold.append(e)  # as it came: time, ids and links are decided when it is written
            continue
        ph = _get(e, O_PH)
        is_x = ph == "X"
        y = ys[i]
        _put(e, O_TS, PyFloat_FromDouble(y / k))
        if kind == K_SPAN:
            dn = dns[i]
            _put(e, O_DUR, PyFloat_FromDouble(dn / k))
        else:
            dn = 0.0
        if y < lo:
            lo = y
        if y > hi:
            hi = y
        if not is_x and _get(e, O_S) == "g" and (ph == "i" or ph == "I"):  # a global instant
            _put(e, O_PID, global_pid)
            _put(e, O_TID, _ZERO)
            counts[ph] = counts.get(ph, 0) + 1
            out.append(e)
            continue
        pid = _get(e, O_PID)
        tid = _get(e, O_TID)
        if tid != last_tid or pid != last_pid:
            if tid == prev_tid and pid == prev_pid:  # back to the other lane (CPU <-> GPU, say)
                last_pid, prev_pid = prev_pid, last_pid
                last_tid, prev_tid = prev_tid, last_tid
                mpid, prev_mpid = prev_mpid, mpid
                mtid, prev_mtid = prev_mtid, mtid
                lane, prev_lane = prev_lane, lane
            else:
                found = by_tid.get(tid)
                if found is None or found[0] != pid:
                    try:
                        m_pid, m_tid = mapper.resolve(pid, tid)
                    except BadIdentity:  # no process can own it: left out, counted
                        no_pid += 1
                        continue
                    key = (m_pid, m_tid)
                    state = lanes.get(key)
                    if state is None:
                        state = lanes[key] = _Lane(first_mode, _EXACT)
                    found = by_tid[tid] = (pid, m_pid, m_tid, state)
                prev_pid, prev_tid, prev_mpid, prev_mtid = last_pid, last_tid, mpid, mtid
                prev_lane = lane
                last_pid, last_tid = pid, tid
                _, mpid, mtid, lane = found
        _put(e, O_PID, mpid)
        _put(e, O_TID, mtid)
        if is_x:
            if lane.mode != 3:  # nesting (.nesting has the rule): certify the lane as it streams
                end = y + dn
                if lane.mode == 1:
                    if y > lane.y or (y == lane.y and dn <= lane.dn):
                        while lane.s1.n and lane.s1.v[lane.s1.n - 1] <= y:
                            lane.s1.n -= 1
                        if lane.s1.n and end > lane.s1.v[lane.s1.n - 1]:
                            lane.mode = 3
                            unsure.add((mpid, mtid))
                        else:
                            lane.push1(end)
                            lane.y, lane.dn = y, dn
                    else:
                        lane.mode = 3
                        unsure.add((mpid, mtid))
                        if y < lane.first:
                            lane.first = y
                elif lane.mode == 2:  # exit order: this slice encloses the earlier ones that start in it
                    if y < lane.first:
                        lane.first = y
                    if end < lane.end:
                        lane.mode = 3
                        unsure.add((mpid, mtid))
                    else:
                        while lane.s1.n and lane.s1.v[lane.s1.n - 1] >= y:
                            lane.s1.n -= 1
                            lane.s2.n -= 1
                        if lane.s2.n and lane.s2.v[lane.s2.n - 1] > y:
                            lane.mode = 3
                            unsure.add((mpid, mtid))
                        else:
                            lane.push1(y)
                            lane.push2(end)
                            lane.end = end
                elif lane.mode == 4:
                    lane.nest_other(y, dn, end)
                    if lane.mode == 3:
                        unsure.add((mpid, mtid))
                else:
                    lane.mode, lane.y, lane.dn, lane.end, lane.first = 4, y, dn, end, y
            elif y < lane.first:
                lane.first = y
            if _get(e, O_BIND) is not _UNSET:
                space.bind(e)
            if scoped is not None and _get(e, O_CAT) == "scope" and _get(e, O_ARGS) is not _UNSET:
                scoped.append(e)
            out.append(e)
            continue
        fid = _get(e, O_ID)
        if (ph == "s" or ph == "t" or ph == "f") and fid is not _UNSET:
            cat = _get(e, O_CAT)
            name = _get(e, O_NAME)
            if cat == _SCOPE_CAT and name == _SCOPE_NAME:  # a scope link: in its rank's id space, not ours
                if viz_scopes is not None and ph == "s":  # link_scopes, VizTracer side
                    if isinstance(fid, int) and fid in viz_scopes:
                        _put(e, O_ID, scope_prefix | (fid & scope_mask))
                        linked += 1
                    else:
                        unlinked += 1
                        continue
                counts[ph] = counts.get(ph, 0) + 1
                out.append(e)
                continue
            if cat != lcat or name != lname:
                chain = chains.setdefault((cat, name), {})
                lcat, lname = cat, name
            # a chain: [new id, has start, has end, events]; a second start begins a new flow, more
            # ends are more links from the same start (CUDA-graph launches), as Perfetto reads them
            st = chain.get(fid)
            if ph == "s":
                n_s += 1
                if st is None or st[1]:
                    if st is not None:
                        if st[3] > 1:
                            links += st[3] - 1
                        else:
                            unpaired += st[3]
                    seq += 1
                    st = chain[fid] = [base | seq, True, False, 1]
                else:
                    st[1] = True
                    st[3] += 1
            elif ph == "f":
                n_f += 1
                if st is None:
                    seq += 1
                    st = chain[fid] = [base | seq, False, True, 1]
                else:
                    st[2] = True
                    st[3] += 1
            else:
                n_t += 1
                if st is None:
                    seq += 1
                    st = chain[fid] = [base | seq, False, False, 1]
                else:
                    st[3] += 1
            _put(e, O_ID, st[0])
            if _get(e, O_BIND) is not _UNSET:
                space.bind(e)
            if y < lane.first:  # no slice of its lane at or before it yet: judged at the end
                early.append((e, y, lane))
            out.append(e)
            continue
        if (ph == "s" or ph == "t" or ph == "f" or ph == "b" or ph == "e" or ph == "n"
                or _get(e, O_BIND) is not _UNSET) and not space.add(e, ph):
            continue
        if ph == "B" and y < lane.first:  # a B slice binds flows too
            lane.first = y
        counts[ph] = counts.get(ph, 0) + 1
        out.append(e)
    if hi - lo > SPREAD_NS:  # times too far apart to judge here (.outliers)
        raise SpreadOut
    result.dropped += bad
    if no_pid:
        ctx.count(BAD_PID, no_pid)
    if in_order is not None:
        for key, state in lanes.items():
            in_order[key] = state.mode == 1 or state.mode == 4 or state.mode == 0
    if unsure:  # lanes not in start or exit order, or with an overlap: Perfetto's rule, exactly
        ns = us_to_exact_ns if k == 1000.0 else int
        count_overlaps(ctx, *to_overlap_tracks(out, by_lane(out, unsure), ns, mapper.threads))
    phases = {"s": n_s, "t": n_t, "f": n_f}
    gone = set()
    for e, t, state in early:
        if t < state.first and (_get(e, O_PH) != "f" or _get(e, O_BP) == "e"):
            gone.add(id(e))
    if gone:  # flow events no slice of their thread can take (.flowbind): left out, counted again
        out = _py._without(out, gone, phases, ctx)
        chains, links, unpaired = {None: _py.recount(out)}, 0, 0
    links, unpaired = _close_chains(chains, links, unpaired, ctx.fanned)
    space.finish({}, links, unpaired, linked, unlinked)
    for flow_ph, c in phases.items():
        counts[flow_ph] = counts.get(flow_ph, 0) + c
    counts["X"] = len(out) - sum(counts.values())
    if scoped is not None:
        scope_ends(scoped, out, counts, ctx)
    counts = {ph: c for ph, c in counts.items() if c}
    if not out:
        return out, counts, None, None
    return out, counts, int(lo), int(hi)
