/* Compiled twins of the codec steps that run for every replica of every entry (proto/speedups.py).
 *
 * Why C: in Python each of them is a regular expression plus a dozen slicing, varint and length steps, and
 * together they were about a quarter of the writer's CPU per entry and a third of a bookie's event loop
 * (docs/PERFORMANCE.md, "Session 12"; what they save, "Session 13", item 1). Each function here returns
 * exactly what its Python twin returns for the same input -- the Python code stays the reference, tests
 * compare both on generated and hostile input -- and hands anything outside its layout back (None, a stop
 * position, or the Python encoder).
 *
 *   scan_add_ok(data, pos, out) -> pos            codec.scan_v3_add_ok(data, pos, out, raw=True)
 *   scan_adds_v3(data, pos, n, limit, out) -> pos the canonical-add part of BookieCodec._scan_adds
 *   decode_add_v3(body, pos=0, end=-1)            server_codec.decode_add_v3
 *   encode_add(lid, eid, key, body, txn, recovery=False, write_flags=0, priority=0)
 *                                                 v3fast.encode_add (its Python twin for errors)
 *   encode_entry_crc32c(lid, eid, lac, length, payload)
 *                                                 entry.DigestManager.encode_entry with a CRC32C digest
 *   encode_add_oks(adds) -> bytes or None      server_codec.encode_add_oks (None: the Python one decides)
 *   add_records(bodies) -> [(header, body)]     journal.add_record_headers zipped with the bodies
 *                                                 (tuples the cyclic GC does not track: see untrack_tuples)
 *   untrack_tuples(items)                         nothing in Python: what the cyclic GC does to these
 *                                                 tuples at its first collection, done at once
 *   deliver_add_oks(data, single, conn, batch_ends, report, pos=0) -> pos
 *                                                 the writer's connection reading its EOK answers
 *                                                 (bookie_client._Connection.data_received)
 *   deliver_v2_add_oks(data, single, conn, batch_ends, report, pos, op) -> pos
 *                                                 the same over v2 (keys (op, ledgerId, entryId)); both
 *                                                 count a write handle's acks themselves (fast_ack:
 *                                                 WriteHandle._on_add_answer, once set_add_answer is called)
 *   read_response_at(data, start, end)            v3.read_response_at_py (a reader's every entry)
 *   decode_entry_crc32c(body, ledger_id, entry_id=None)
 *                                                 entry.DigestManager.decode_entry when all checks out
 *   encode_read(lid, eid, txn)                    v3fast.encode_read_py (its Python twin for errors)
 *   decode_read_v3(data, start=0, end=None)       server_codec.decode_read_v3_py
 *   encode_read_ok(txn, lid, eid, body, lac)      v3fast.encode_read_ok_py
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* The Python encoders: called for arguments this file does not encode itself (errors, odd types). */
static PyObject *encode_add_fallback = NULL;
static PyObject *encode_entry_fallback = NULL;
static PyObject *encode_add_head_fallback = NULL;
static PyObject *encode_add_head_v2_fallback = NULL;

/* A varint of at most `max_bytes` bytes, the high bit set on all but the last (a zero last byte allowed): the
 * `[\x80-\xff]{0,k}[\x00-\x7f]` groups of the Python patterns. Returns its length, 0 if `p[0:avail]` does not
 * start with one. */
static Py_ssize_t
varint_upto(const unsigned char *p, Py_ssize_t avail, Py_ssize_t max_bytes, uint64_t *value)
{
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < max_bytes && i < avail; i++) {
        v |= (uint64_t)(p[i] & 0x7F) << (7 * i);
        if (p[i] < 0x80) {
            *value = v;
            return i + 1;
        }
    }
    return 0;
}

/* A varint as the client's AddResponse pattern takes it: up to 8 bytes with the high bit set, then one
 * without (a zero last byte allowed). */
static Py_ssize_t
varint_loose(const unsigned char *p, Py_ssize_t avail, uint64_t *value)
{
    return varint_upto(p, avail, 9, value);
}

/* A canonical varint of a value below 2**63 (the bookie's pattern): one byte below 0x80, or 1 to 8 bytes
 * with the high bit set and a last byte 0x01..0x7f. Canonical encodings are unique, so two of them are equal
 * exactly when their values are. */
static Py_ssize_t
varint_canonical(const unsigned char *p, Py_ssize_t avail, uint64_t *value)
{
    Py_ssize_t n = varint_loose(p, avail, value);
    if (n > 1 && p[n - 1] == 0) {
        return 0;
    }
    return n;
}

static void put_be64(unsigned char *p, int64_t v);

static Py_ssize_t
varint_put(unsigned char *p, uint64_t v)
{
    Py_ssize_t n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}

static Py_ssize_t
varint_len(uint64_t v)
{
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return (int64_t)v;
}

/* --- the client: EOK AddResponses ----------------------------------------------------------------------- */

static const unsigned char ADD_OK_HEADER[] = {0x08, 0x03, 0x10, 0x02, 0x18};
static const unsigned char ADD_OK_STATUS[] = {0x10, 0x00, 0xaa, 0x06};
static const unsigned char ADD_OK_PART[] = {0x08, 0x00, 0x10};

/* The length of the whole EOK AddResponse frame at p[0:avail] and its (txn, lid, eid) varints; 0 if the
 * bytes there are anything else (codec._V3_ADD_OK_FRAME and the length checks after it). */
static Py_ssize_t
match_add_ok(const unsigned char *p, Py_ssize_t avail, uint64_t *txn, Py_ssize_t *lid_at, Py_ssize_t *lid_n,
             Py_ssize_t *eid_at, Py_ssize_t *eid_n)
{
    uint64_t unused;
    Py_ssize_t i, tn, ln, en;
    if (avail < 11 || p[0] || p[1] || p[2] || p[4] != 0x0a || memcmp(p + 6, ADD_OK_HEADER, 5) != 0) {
        return 0;
    }
    i = 11;
    if ((tn = varint_loose(p + i, avail - i, txn)) == 0) {
        return 0;
    }
    i += tn;
    if (avail - i < 8 || memcmp(p + i, ADD_OK_STATUS, 4) != 0 || memcmp(p + i + 5, ADD_OK_PART, 3) != 0) {
        return 0;
    }
    unsigned char plen = p[i + 4];
    i += 8;
    if ((ln = varint_loose(p + i, avail - i, &unused)) == 0) {
        return 0;
    }
    *lid_at = i;
    *lid_n = ln;
    i += ln;
    if (avail - i < 1 || p[i] != 0x18) {
        return 0;
    }
    i += 1;
    if ((en = varint_loose(p + i, avail - i, &unused)) == 0) {
        return 0;
    }
    *eid_at = i;
    *eid_n = en;
    i += en;
    if (p[3] != i - 4 || p[5] != 5 + tn || plen != 4 + ln + en) {
        return 0;
    }
    return i;
}

static PyObject *
scan_add_ok(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t pos;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan_add_ok(data, pos, out) takes 3 arguments");
        return NULL;
    }
    if ((pos = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *buf = view.buf;
    /* (A negative position finds nothing, as in the Python scan.) */
    while (pos >= 0 && pos < view.len) {
        uint64_t txn;
        Py_ssize_t lid_at, lid_n, eid_at, eid_n;
        Py_ssize_t n = match_add_ok(buf + pos, view.len - pos, &txn, &lid_at, &lid_n, &eid_at, &eid_n);
        if (n == 0) {
            break;
        }
        PyObject *item = Py_BuildValue("(Ky#y#)", (unsigned long long)txn, buf + pos + lid_at, lid_n,
                                       buf + pos + eid_at, eid_n);
        if (item == NULL || PyList_Append(args[2], item) < 0) {
            Py_XDECREF(item);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(item);
        pos += n;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);
}

static PyObject *str_pending_count = NULL;
static PyObject *int_one = NULL;

/* The exception set now, if it is an Exception, given to `report` (as `except Exception as e: report(e)`)
 * and cleared: 0. Anything else (KeyboardInterrupt, SystemExit: not a callback's bug), or an exception from
 * `report` itself, stays set: -1. */
static int
report_exception(PyObject *report)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *reported = PyObject_CallOneArg(report, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (reported == NULL) {
        return -1;
    }
    Py_DECREF(reported);
    return 0;
}

/* --- a writer's ack counted in C (write_handle.WriteHandle._on_add_answer with AddTracker.ack) ----------
 *
 * Every ack of every entry reaches the writer as `handle._on_add_answer(sent, None, None)`, and most only
 * count: set a bit of the pending add and say whether the entry has its A acks now. Two Python calls per
 * ack; at 10,000 ledgers written round robin twice per entry (docs/PERFORMANCE.md, "Session 25"). When the
 * waiter's callback is that method of a write handle, `fast_ack` makes the same decision here for the
 * common state -- the handle not abandoned, the entry pending, in the last ensemble, no bookie awaiting
 * replacement, the bookie one of the entry's write set -- and hands everything else to the Python method,
 * which stays the reference (tests/client/test_fast_ack.py compares the two). It reads the objects' slots
 * by the offsets of their member descriptors, found by name once (`set_add_answer`), and only on objects of
 * exactly the registered types. */

static PyObject *ack_method = NULL;    /* the function WriteHandle._on_add_answer */
static PyTypeObject *ack_handle_type = NULL, *ack_tracker_type = NULL, *ack_pending_type = NULL;
static Py_ssize_t off_abandoned, off_tracker, off_drain_due;
static Py_ssize_t off_pending, off_last_for, off_ensembles, off_last_start, off_last_list, off_failed,
    off_write_sets, off_ensemble_size, off_ack_quorum;
static Py_ssize_t off_acked, off_outstanding;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* The offset of slot `name` of `type` (a member descriptor holding an object), -1 with an exception set. */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL) {
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX) {
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    } else {
        PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, name);
    }
    Py_DECREF(d);
    return off;
}

/* A slot's int as a C value >= 0 and < 2**62, or -1 (anything else, no exception left set). */
static long long
small_int(PyObject *v)
{
    if (v == NULL || !PyLong_CheckExact(v)) {
        return -1;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return overflow || x < 0 || x >= (1LL << 62) ? -1 : x;
}

/* Replace slot `off` of `obj` with a new int `v`: 0, or -1 with an exception set. */
static int
set_int_slot(PyObject *obj, Py_ssize_t off, long long v)
{
    PyObject *n = PyLong_FromLongLong(v);
    if (n == NULL) {
        return -1;
    }
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = n;
    Py_XDECREF(old);
    return 0;
}

/* `handle._on_add_answer(sent, None, None)` for an ack: 1 (True) or 0 (False) as it returns, -2 when the
 * Python method must decide (nothing changed), -1 with an exception set. */
static int
fast_ack(PyObject *handle, PyObject *sent)
{
    /* Only exact ints, strs, tuples, dicts and sets are read, so no Python code runs here (no __eq__,
     * __hash__ or __bool__ of a subclass) and nothing read can change or go away meanwhile. */
    if (Py_TYPE(handle) != ack_handle_type || SLOT(handle, off_abandoned) != Py_None) {
        return -2;
    }
    PyObject *tracker = SLOT(handle, off_tracker), *due = SLOT(handle, off_drain_due);
    if (tracker == NULL || Py_TYPE(tracker) != ack_tracker_type || (due != Py_True && due != Py_False) ||
        !PyTuple_CheckExact(sent) || PyTuple_GET_SIZE(sent) != 4) {
        return -2;
    }
    PyObject *eid_obj = PyTuple_GET_ITEM(sent, 0), *bookie = PyTuple_GET_ITEM(sent, 2);
    PyObject *pending_adds = SLOT(tracker, off_pending);
    long long eid = small_int(eid_obj);
    if (eid < 0 || !PyUnicode_CheckExact(bookie) || pending_adds == NULL || !PyDict_CheckExact(pending_adds)) {
        return -2;
    }
    PyObject *pending = PyDict_GetItemWithError(pending_adds, eid_obj); /* borrowed */
    if (pending == NULL) {
        return PyErr_Occurred() ? -1 : -2; /* a late or duplicate answer: the Python method's bookkeeping */
    }
    PyObject *ensembles = SLOT(tracker, off_ensembles), *failed = SLOT(tracker, off_failed);
    PyObject *ensemble = SLOT(tracker, off_last_list), *write_sets = SLOT(tracker, off_write_sets);
    long long start = small_int(SLOT(tracker, off_last_start));
    long long size = small_int(SLOT(tracker, off_ensemble_size)), quorum = small_int(SLOT(tracker, off_ack_quorum));
    if (Py_TYPE(pending) != ack_pending_type || ensembles == NULL || SLOT(tracker, off_last_for) != ensembles ||
        start < 0 || eid < start || size <= 0 || quorum < 0 || ensemble == NULL || !PyTuple_CheckExact(ensemble) ||
        failed == NULL || !PyAnySet_CheckExact(failed) || PySet_GET_SIZE(failed) != 0 || write_sets == NULL ||
        !PyTuple_CheckExact(write_sets) || PyTuple_GET_SIZE(write_sets) != size) {
        return -2;
    }
    /* `ensemble.index(bookie)`: the first equal item, identity first (as a tuple compares). */
    Py_ssize_t index = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ensemble) && index < 0; i++) {
        PyObject *item = PyTuple_GET_ITEM(ensemble, i);
        if (!PyUnicode_CheckExact(item)) {
            return -2;
        }
        if (item == bookie || PyUnicode_Compare(item, bookie) == 0) {
            index = i;
        }
    }
    PyObject *write_set = PyTuple_GET_ITEM(write_sets, eid % size);
    if (index < 0 || index >= 62 || !PyTuple_CheckExact(write_set)) {
        return -2;
    }
    int member = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(write_set) && !member; i++) {
        member = small_int(PyTuple_GET_ITEM(write_set, i)) == index;
    }
    long long acked = small_int(SLOT(pending, off_acked)), outstanding = small_int(SLOT(pending, off_outstanding));
    if (!member || acked < 0 || outstanding < 0) {
        return -2;
    }
    long long bit = 1LL << index;
    acked |= bit;
    if (set_int_slot(pending, off_outstanding, outstanding & ~bit) < 0 || set_int_slot(pending, off_acked, acked) < 0) {
        return -1;
    }
    if (__builtin_popcountll((unsigned long long)acked) >= quorum) {
        Py_INCREF(Py_True);
        SLOT(handle, off_drain_due) = Py_True;
        Py_DECREF(due);
        return 1;
    }
    return due == Py_True;
}

/* set_add_answer(method, handle_type, tracker_type, pending_type): register WriteHandle._on_add_answer and
 * the types whose slots `fast_ack` reads; set_add_answer(None) turns it off. */
static PyObject *
set_add_answer(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        Py_CLEAR(ack_method);
        return Py_NewRef(Py_None);
    }
    if (nargs != 4 || !PyFunction_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "set_add_answer(method, handle_type, tracker_type, pending_type)");
        return NULL;
    }
    PyTypeObject *h = (PyTypeObject *)args[1], *t = (PyTypeObject *)args[2], *p = (PyTypeObject *)args[3];
    if ((off_abandoned = slot_offset(h, "_abandoned")) < 0 || (off_tracker = slot_offset(h, "_tracker")) < 0 ||
        (off_drain_due = slot_offset(h, "_drain_due")) < 0 || (off_pending = slot_offset(t, "_pending")) < 0 ||
        (off_last_for = slot_offset(t, "_last_for")) < 0 || (off_ensembles = slot_offset(t, "ensembles")) < 0 ||
        (off_last_start = slot_offset(t, "_last_start")) < 0 || (off_last_list = slot_offset(t, "_last_list")) < 0 ||
        (off_failed = slot_offset(t, "_failed_bookies")) < 0 ||
        (off_write_sets = slot_offset(t, "_write_sets")) < 0 ||
        (off_ensemble_size = slot_offset(t, "_ensemble_size")) < 0 ||
        (off_ack_quorum = slot_offset(t, "_ack_quorum")) < 0 || (off_acked = slot_offset(p, "acked")) < 0 ||
        (off_outstanding = slot_offset(p, "outstanding")) < 0) {
        Py_CLEAR(ack_method);
        return NULL;
    }
    Py_XSETREF(ack_method, Py_NewRef(args[0]));
    Py_XSETREF(ack_handle_type, (PyTypeObject *)Py_NewRef(h));
    Py_XSETREF(ack_tracker_type, (PyTypeObject *)Py_NewRef(t));
    Py_XSETREF(ack_pending_type, (PyTypeObject *)Py_NewRef(p));
    return Py_NewRef(Py_None);
}

/* One EOK answer delivered to the writer's waiter filed under `key` in `single`, the (callback, context,
 * batch_end) tuple: taken out, `conn.pending_count` lowered, `callback(context, None, None)` called, then
 * `batch_ends[batch_end] = None` unless the callback returned False (nothing waits for the batch end). An
 * Exception from the callback (or from filing its batch end) goes to `report(exc)` and skips its batch end. Returns 1 once delivered, 0 when `single` holds no such waiter
 * under `key` (nothing done: none, a future, a pair), -1 with an exception set. */
static int
deliver_one(PyObject *single, PyObject *key, PyObject *conn, PyObject *batch_ends, PyObject *report)
{
    PyObject *waiter = PyDict_GetItemWithError(single, key); /* borrowed */
    if (waiter == NULL || !PyTuple_CheckExact(waiter) || PyTuple_GET_SIZE(waiter) != 3) {
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(waiter);
    if (PyDict_DelItem(single, key) < 0) {
        Py_DECREF(waiter);
        return -1;
    }
    /* `conn.pending_count -= 1`, with Python's arithmetic (no C integer to overflow or to refuse a count). */
    PyObject *count = PyObject_GetAttr(conn, str_pending_count);
    PyObject *lowered = count == NULL ? NULL : PyNumber_InPlaceSubtract(count, int_one);
    Py_XDECREF(count);
    if (lowered == NULL || PyObject_SetAttr(conn, str_pending_count, lowered) < 0) {
        Py_XDECREF(lowered);
        Py_DECREF(waiter);
        return -1;
    }
    Py_DECREF(lowered);
    /* The callback, then its batch end filed: an Exception from either goes to `report` (both are in
     * `_deliver_add_ok`'s try), and skips the rest of this answer. */
    PyObject *callback = PyTuple_GET_ITEM(waiter, 0);
    int acked = -2;
    if (ack_method != NULL && PyMethod_Check(callback) && PyMethod_GET_FUNCTION(callback) == ack_method) {
        acked = fast_ack(PyMethod_GET_SELF(callback), PyTuple_GET_ITEM(waiter, 1));
    }
    int failed, wants_end;
    if (acked == -2) {
        PyObject *cargs[3] = {PyTuple_GET_ITEM(waiter, 1), Py_None, Py_None};
        PyObject *result = PyObject_Vectorcall(callback, cargs, 3, NULL);
        failed = result == NULL;
        wants_end = result != Py_False;
        Py_XDECREF(result);
    } else {
        failed = acked == -1;
        wants_end = acked == 1;
    }
    if (!failed && wants_end && PyDict_SetItem(batch_ends, PyTuple_GET_ITEM(waiter, 2), Py_None) < 0) {
        failed = 1;
    }
    Py_DECREF(waiter);
    if (failed && report_exception(report) < 0) {
        return -1;
    }
    return 1;
}

/* The arguments both deliveries share: (data, single: dict, conn, batch_ends: dict, report, pos). */
static int
delivery_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t nmax, Py_ssize_t *pos, const char *usage)
{
    if (nargs < 5 || nargs > nmax || !PyDict_CheckExact(args[1]) || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *pos = 0;
    if (nargs >= 6 && (*pos = PyLong_AsSsize_t(args[5])) == -1 && PyErr_Occurred()) {
        return -1;
    }
    return 0;
}

/* The EOK AddResponse frames at `data[pos:]`, delivered as bookie_client._Connection._deliver_add_ok
 * delivers them to a writer's waiter filed under the txn id in `single` (`deliver_one`).
 * Stops, before it, at the first frame that is not such an answer or whose waiter is anything else (none, a
 * future, a pair): the caller reads the rest through the codec. Returns where it stopped. */
static PyObject *
deliver_add_oks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t pos;
    if (delivery_args(args, nargs, 6, &pos,
                      "deliver_add_oks(data, single: dict, conn, batch_ends: dict, report, pos=0)") < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *buf = view.buf;
    while (pos >= 0 && pos < view.len) {
        uint64_t txn;
        Py_ssize_t lid_at, lid_n, eid_at, eid_n;
        Py_ssize_t n = match_add_ok(buf + pos, view.len - pos, &txn, &lid_at, &lid_n, &eid_at, &eid_n);
        if (n == 0) {
            break;
        }
        PyObject *key = PyLong_FromUnsignedLongLong(txn);
        if (key == NULL) {
            goto error;
        }
        int delivered = deliver_one(args[1], key, args[2], args[3], args[4]);
        Py_DECREF(key);
        if (delivered < 0) {
            goto error;
        }
        if (delivered == 0) {
            break;
        }
        pos += n;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);
error:
    PyBuffer_Release(&view);
    return NULL;
}

/* A whole v2 ADD answer with rc EOK and no flags, up to its ids: length 24, header (version 2, ADD_ENTRY,
 * flags 0), rc 0; then ledgerId and entryId, big-endian. */
static const unsigned char V2_ADD_OK_HEAD[12] = {0, 0, 0, 24, 2, 1, 0, 0, 0, 0, 0, 0};
#define V2_ADD_OK_FRAME_BYTES 28

static int64_t
get_be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return (int64_t)v;
}

/* The v2 twin of `deliver_add_oks`: the EOK ADD answers at `data[pos:]` (v2.scan_add_ok's frames), each
 * delivered to the writer's waiter filed in `single` under the key (op, ledgerId, entryId), `op` being the
 * caller's own ADD opcode object (bookie_client._Connection._deliver_v2_add_ok). Stops as that one does. */
static PyObject *
deliver_v2_add_oks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t pos;
    const char *usage = "deliver_v2_add_oks(data, single: dict, conn, batch_ends: dict, report, pos, op)";
    if (delivery_args(args, nargs, 7, &pos, usage) < 0) {
        return NULL;
    }
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *buf = view.buf;
    while (pos >= 0 && view.len - pos >= V2_ADD_OK_FRAME_BYTES &&
           memcmp(buf + pos, V2_ADD_OK_HEAD, sizeof V2_ADD_OK_HEAD) == 0) {
        PyObject *lid = PyLong_FromLongLong(get_be64(buf + pos + 12));
        PyObject *eid = lid == NULL ? NULL : PyLong_FromLongLong(get_be64(buf + pos + 20));
        PyObject *key = eid == NULL ? NULL : PyTuple_Pack(3, args[6], lid, eid);
        Py_XDECREF(lid);
        Py_XDECREF(eid);
        if (key == NULL) {
            goto error;
        }
        int delivered = deliver_one(args[1], key, args[2], args[3], args[4]);
        Py_DECREF(key);
        if (delivered < 0) {
            goto error;
        }
        if (delivered == 0) {
            break;
        }
        pos += V2_ADD_OK_FRAME_BYTES;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);
error:
    PyBuffer_Release(&view);
    return NULL;
}

/* --- the bookie: canonical v3 AddRequests ---------------------------------------------------------------- */

static const unsigned char ADD_HEADER[] = {0x08, 0x03, 0x10, 0x02, 0x18};

/* The FastAdd tuple (ledgerId, entryId, masterKey, entry, lac, txn_raw, entry_raw, ledger_raw), built item by item:
 * Py_BuildValue parsed its format string for every add. NULL with an exception set if memory runs out. */
static PyObject *
fast_add_tuple(long long lid, long long eid, const unsigned char *key, const unsigned char *entry,
               Py_ssize_t entry_len, long long lac, const unsigned char *txn, Py_ssize_t tn,
               const unsigned char *eid_raw, Py_ssize_t en, const unsigned char *lid_raw, Py_ssize_t ln)
{
    PyObject *t = PyTuple_New(8);
    if (t == NULL) {
        return NULL;
    }
    /* One at a time: no call may run with the previous one's exception set. A tuple with some items still NULL
     * frees the others. */
    PyObject *item;
#define SET_ITEM(i, make)          \
    if ((item = (make)) == NULL) { \
        Py_DECREF(t);              \
        return NULL;               \
    }                              \
    PyTuple_SET_ITEM(t, i, item)
    SET_ITEM(0, PyLong_FromLongLong(lid));
    SET_ITEM(1, PyLong_FromLongLong(eid));
    SET_ITEM(2, PyBytes_FromStringAndSize((const char *)key, 20));
    SET_ITEM(3, PyBytes_FromStringAndSize((const char *)entry, entry_len));
    SET_ITEM(4, PyLong_FromLongLong(lac));
    SET_ITEM(5, PyBytes_FromStringAndSize((const char *)txn, tn));
    SET_ITEM(6, PyBytes_FromStringAndSize((const char *)eid_raw, en));
    SET_ITEM(7, PyBytes_FromStringAndSize((const char *)lid_raw, ln));
#undef SET_ITEM
    return t;
}

/* The FastAdd tuple of the plain v3 add whose frame body is p[0:avail], a new reference to None if it is
 * not one (server_codec._V3_ADD and decode_add_v3's checks), NULL on a Python error. */
static PyObject *
fast_add(const unsigned char *p, Py_ssize_t avail)
{
    uint64_t txn, part_len, lid_v, eid_v, entry_len;
    Py_ssize_t i, tn, pn, ln, en, kn;
    Py_ssize_t lid_at, eid_at, key_at, start;
    if (avail < 7 || p[0] != 0x0a || p[1] < 0x06 || p[1] > 0x0e || memcmp(p + 2, ADD_HEADER, 5) != 0) {
        Py_RETURN_NONE;
    }
    i = 7;
    if ((tn = varint_canonical(p + i, avail - i, &txn)) == 0) {
        Py_RETURN_NONE;
    }
    i += tn;
    if (avail - i < 2 || p[i] != 0xaa || p[i + 1] != 0x06) {
        Py_RETURN_NONE;
    }
    i += 2;
    if ((pn = varint_canonical(p + i, avail - i, &part_len)) == 0) {
        Py_RETURN_NONE;
    }
    i += pn;
    if (avail - i < 1 || p[i] != 0x08) {
        Py_RETURN_NONE;
    }
    i += 1;
    lid_at = i;
    if ((ln = varint_canonical(p + i, avail - i, &lid_v)) == 0) {
        Py_RETURN_NONE;
    }
    i += ln;
    if (avail - i < 1 || p[i] != 0x10) {
        Py_RETURN_NONE;
    }
    i += 1;
    eid_at = i;
    if ((en = varint_canonical(p + i, avail - i, &eid_v)) == 0) {
        Py_RETURN_NONE;
    }
    i += en;
    if (avail - i < 23 || p[i] != 0x1a || p[i + 1] != 0x14 || p[i + 22] != 0x22) {
        Py_RETURN_NONE;
    }
    key_at = i + 2;
    i += 23;
    if ((kn = varint_canonical(p + i, avail - i, &entry_len)) == 0) {
        Py_RETURN_NONE;
    }
    start = i + kn;
    if (p[1] != 5 + tn || avail - start < 32 || entry_len != (uint64_t)(avail - start) ||
        part_len != (uint64_t)(avail - 4 - p[1] - pn)) {
        Py_RETURN_NONE;
    }
    int64_t lid = be64(p + start), eid = be64(p + start + 8), lac = be64(p + start + 16);
    /* The ids the entry repeats must be the request's (else `v3` decodes it and the bookie says EBADREQ). */
    if (lid < 0 || eid < 0 || (uint64_t)lid != lid_v || (uint64_t)eid != eid_v) {
        Py_RETURN_NONE;
    }
    return fast_add_tuple(lid, eid, p + key_at, p + start, avail - start, lac, p + 7, tn, p + eid_at, en, p + lid_at,
                          ln);
}

/* The FastAdd of a v2 ADD frame body without flags, as server_codec.decode_add_v2 decodes it: (ledgerId,
 * entryId, masterKey, entry, lac, b"", b"", b""), the ids and LAC (signed) from the entry's header, which v2 takes
 * them from; None for anything else (another request, a recovery add, a body too short for a key and an entry
 * header). */
#define V2_ADD_MIN (4 + 20 + 32)
static const unsigned char V2_ADD_HEADER[4] = {0x02, 0x01, 0x00, 0x00}; /* version 2, ADD_ENTRY, flags 0 */

static PyObject *
fast_add_v2(const unsigned char *p, Py_ssize_t avail)
{
    if (avail < V2_ADD_MIN || memcmp(p, V2_ADD_HEADER, 4) != 0) {
        Py_RETURN_NONE;
    }
    const unsigned char *entry = p + 4 + 20;
    long long lid = be64(entry), eid = be64(entry + 8), lac = be64(entry + 16);
    return fast_add_tuple(lid, eid, p + 4, entry, avail - 24, lac, p, 0, p, 0, p, 0);
}

static PyObject *
decode_add_v3(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t pos = 0, end = -1;
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "decode_add_v3(body, pos=0, end=-1) takes 1 to 3 arguments");
        return NULL;
    }
    if (nargs > 1 && (pos = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (nargs > 2 && (end = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (end < 0 || end > view.len) {
        end = view.len;
    }
    PyObject *result;
    if (pos < 0 || pos >= end) {
        result = Py_NewRef(Py_None);
    } else {
        result = fast_add((const unsigned char *)view.buf + pos, end - pos);
    }
    PyBuffer_Release(&view);
    return result;
}

/* The whole add frames from pos on that `decode` takes, appended to `out`, up to the first it does not (or one
 * not whole in data[:n], or longer than `limit`); returns where they end. `name` is for the arguments error. */
static PyObject *
scan_adds(PyObject *const *args, Py_ssize_t nargs, PyObject *(*decode)(const unsigned char *, Py_ssize_t),
          const char *name)
{
    Py_buffer view;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "%s(data, pos, n, limit, out) takes 5 arguments", name);
        return NULL;
    }
    /* (One at a time: a conversion must not run with the previous one's exception set.) */
    Py_ssize_t pos, n, limit;
    if ((pos = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if ((n = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if ((limit = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *buf = view.buf;
    /* 0 <= n <= len and pos >= 0, so `n - pos` cannot overflow (n = -2**63 wrapped it round to a large
     * number, and the length prefix was read at `pos`, past the buffer). A negative n stops the scan at once,
     * as `n - pos >= 4` does in Python. */
    if (n > view.len) {
        n = view.len;
    }
    if (n < 0) {
        n = 0;
    }
    while (pos >= 0 && n - pos >= 4) {
        Py_ssize_t length = ((Py_ssize_t)buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3];
        Py_ssize_t end = pos + 4 + length;
        if (end > n || length > limit) {
            break;
        }
        PyObject *add = decode(buf + pos + 4, length);
        if (add == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
        if (add == Py_None) {
            Py_DECREF(add);
            break;
        }
        int failed = PyList_Append(args[4], add);
        Py_DECREF(add);
        if (failed) {
            PyBuffer_Release(&view);
            return NULL;
        }
        pos = end;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);
}

static PyObject *
scan_adds_v3(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return scan_adds(args, nargs, fast_add, "scan_adds_v3");
}

static PyObject *
scan_adds_v2(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return scan_adds(args, nargs, fast_add_v2, "scan_adds_v2");
}

/* The EOK answers to a batch of FastAdd tuples, one frame each in the add's own protocol version, joined:
 * byte for byte what server_codec.encode_add_oks appends. None (the Python function decides, and raises
 * what it raises) for anything but well-formed tuples. */
static PyObject *
encode_add_oks(PyObject *self, PyObject *adds)
{
    if (!PyList_CheckExact(adds) || PyList_GET_SIZE(adds) == 0) {
        Py_RETURN_NONE;
    }
    Py_ssize_t count = PyList_GET_SIZE(adds), total = 0;
    /* Which answers go out in v2, as the Python function decides: all of them when the first add came over v2
     * (a connection never goes back to v3), else those without a txnId when the last add came over v2. */
    int all_v2 = -1, mixed = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *a = PyList_GET_ITEM(adds, i);
        if (!PyTuple_CheckExact(a) || PyTuple_GET_SIZE(a) != 8 || !PyBytes_CheckExact(PyTuple_GET_ITEM(a, 5)) ||
            !PyBytes_CheckExact(PyTuple_GET_ITEM(a, 6)) || !PyBytes_CheckExact(PyTuple_GET_ITEM(a, 7)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(a, 0)) || !PyLong_CheckExact(PyTuple_GET_ITEM(a, 1))) {
            Py_RETURN_NONE;
        }
        Py_ssize_t tn = PyBytes_GET_SIZE(PyTuple_GET_ITEM(a, 5));
        if (all_v2 < 0) {
            all_v2 = tn == 0;
        }
        if (i == count - 1) {
            mixed = tn == 0;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *a = PyList_GET_ITEM(adds, i);
        Py_ssize_t tn = PyBytes_GET_SIZE(PyTuple_GET_ITEM(a, 5)), en = PyBytes_GET_SIZE(PyTuple_GET_ITEM(a, 6)),
                   ln = PyBytes_GET_SIZE(PyTuple_GET_ITEM(a, 7));
        if (all_v2 || (mixed && tn == 0)) {
            total += 28; /* v2: length, header, rc, ledgerId, entryId */
        } else if (ln == 0 || tn > 10 || ln > 10 || en > 10) {
            Py_RETURN_NONE;
        } else {
            total += 4 + 2 + (5 + tn) + 2 + 3 + (4 + ln + en);
        }
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *a = PyList_GET_ITEM(adds, i);
        PyObject *txn = PyTuple_GET_ITEM(a, 5), *eid = PyTuple_GET_ITEM(a, 6), *lid = PyTuple_GET_ITEM(a, 7);
        Py_ssize_t tn = PyBytes_GET_SIZE(txn), en = PyBytes_GET_SIZE(eid), ln = PyBytes_GET_SIZE(lid);
        if (all_v2 || (mixed && tn == 0)) {
            int overflow = 0;
            long long lid_v = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(a, 0), &overflow);
            long long eid_v = overflow ? 0 : PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(a, 1), &overflow);
            if (overflow || PyErr_Occurred()) {
                PyErr_Clear();
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
            static const unsigned char v2_head[] = {0, 0, 0, 24, 2, 1, 0, 0, 0, 0, 0, 0};
            memcpy(p, v2_head, 12);
            put_be64(p + 12, lid_v);
            put_be64(p + 20, eid_v);
            p += 28;
            continue;
        }
        Py_ssize_t hdr = 5 + tn, part = 4 + ln + en, frame = 2 + hdr + 2 + 3 + part;
        p[0] = (unsigned char)(frame >> 24);
        p[1] = (unsigned char)(frame >> 16);
        p[2] = (unsigned char)(frame >> 8);
        p[3] = (unsigned char)frame;
        p[4] = 0x0a;
        p[5] = (unsigned char)hdr;
        memcpy(p + 6, ADD_OK_HEADER, 5);
        p += 11;
        memcpy(p, PyBytes_AS_STRING(txn), tn);
        p += tn;
        memcpy(p, ADD_OK_STATUS, 4);
        p[4] = (unsigned char)part;
        memcpy(p + 5, ADD_OK_PART, 3);
        p += 8;
        memcpy(p, PyBytes_AS_STRING(lid), ln);
        p += ln;
        *p++ = 0x18;
        memcpy(p, PyBytes_AS_STRING(eid), en);
        p += en;
    }
    return out;
}

/* --- the bookie: journal records of adds ------------------------------------------------------------------ */

static uint32_t crc32c(uint32_t crc, const unsigned char *p, Py_ssize_t n);

/* (header, body) per entry body: the 9-byte ADD record header (CRC32C of length, type and body; length; type
 * 1), as journal.add_record_header makes it. None for anything but a list of bytes. */
static PyObject *
add_records(PyObject *self, PyObject *bodies)
{
    if (!PyList_CheckExact(bodies)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t count = PyList_GET_SIZE(bodies);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *b = PyList_GET_ITEM(bodies, i);
        if (!PyBytes_CheckExact(b) || PyBytes_GET_SIZE(b) > 0xFFFFFFFFLL) {
            Py_RETURN_NONE;
        }
    }
    PyObject *out = PyList_New(count);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *b = PyList_GET_ITEM(bodies, i);
        Py_ssize_t n = PyBytes_GET_SIZE(b);
        unsigned char head[9];
        head[4] = (unsigned char)(n >> 24);
        head[5] = (unsigned char)(n >> 16);
        head[6] = (unsigned char)(n >> 8);
        head[7] = (unsigned char)n;
        head[8] = 1; /* RecordType.ADD */
        uint32_t crc = crc32c(crc32c(0, head + 4, 5), (const unsigned char *)PyBytes_AS_STRING(b), n);
        head[0] = (unsigned char)(crc >> 24);
        head[1] = (unsigned char)(crc >> 16);
        head[2] = (unsigned char)(crc >> 8);
        head[3] = (unsigned char)crc;
        PyObject *record = Py_BuildValue("(y#O)", head, (Py_ssize_t)9, b);
        if (record == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject_GC_UnTrack(record); /* two bytes objects: no cycle can go through it (untrack_tuples) */
        PyList_SET_ITEM(out, i, record);
    }
    return out;
}

/* Stop the cyclic GC tracking each tuple of the list `items` that holds no container but untracked tuples
 * (ints, bytes, strings, ...): it can never be part of a cycle. The GC untracks such tuples itself, but only once a
 * collection has walked them. A bookie's write cache keeps a (ledger, entry) key and a (header, body) record
 * per entry until the next checkpoint, and the index commit keeps the keys for up to
 * `index_commit_checkpoints` checkpoints: tens of thousands of tuples, which every young collection walked
 * (12 ms each, one or two a second at 110k adds/s; docs/PERFORMANCE.md, "Session 24"). Anything else in the
 * list is left as it is. */
static PyObject *
untrack_tuples(PyObject *self, PyObject *items)
{
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "untrack_tuples: expected a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(t) || !PyObject_GC_IsTracked(t)) {
            continue;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(t);
        Py_ssize_t j = 0;
        for (; j < n; j++) {
            PyObject *item = PyTuple_GET_ITEM(t, j);
            /* CPython's own rule (_PyTuple_MaybeUntrack): only a tuple is judged by whether it is tracked
             * now; any other container may become tracked later (an empty dict is untracked until it gets
             * one), so a tuple holding one stays tracked. */
            if (PyObject_IS_GC(item) && (!PyTuple_CheckExact(item) || PyObject_GC_IsTracked(item))) {
                break;
            }
        }
        if (j == n) {
            PyObject_GC_UnTrack(t);
        }
    }
    Py_RETURN_NONE;
}

/* --- the client: AddRequest frames ---------------------------------------------------------------------- */

/* What an encoder does not encode itself goes to its Python twin `fn` (installed by the Python module), so
 * both fail alike. */
static PyObject *
call_fallback(PyObject *fn, const char *name, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (fn == NULL) {
        PyErr_Format(PyExc_RuntimeError, "quorumlog.proto._speedups: no %s fallback installed", name);
        return NULL;
    }
    return PyObject_Vectorcall(fn, args, nargsf, kwnames);
}

/* An int argument as int64, or 0 with *ok = 0 when it is not an exact int in [-2**63, 2**63). */
static int64_t
int64_arg(PyObject *o, int *ok)
{
    int overflow = 0;
    if (!PyLong_CheckExact(o)) {
        *ok = 0;
        return 0;
    }
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        *ok = 0;
        return 0;
    }
    return v;
}

/* The sizes of a v3 ADD frame: what encode_add and encode_add_head both lay out. Negative ids go out
 * sign-extended to 64 bits, as protobuf writes an int64. */
typedef struct {
    uint64_t lid, eid, txn, priority;
    Py_ssize_t klen, blen, hdr, part, frame;
} AddLayout;

/* The layout of the frame with these fields, a master key of klen bytes, a body of blen bytes and tail_n
 * bytes after it (write flags, recovery flag); 0 when it would not fit its 4-byte length. */
static int
add_layout(AddLayout *l, int64_t lid, int64_t eid, int64_t txn, int64_t priority, Py_ssize_t klen,
           Py_ssize_t blen, Py_ssize_t tail_n)
{
    l->lid = (uint64_t)lid;
    l->eid = (uint64_t)eid;
    l->txn = (uint64_t)txn;
    l->priority = (uint64_t)priority;
    l->klen = klen;
    l->blen = blen;
    l->part = 1 + varint_len(l->lid) + 1 + varint_len(l->eid) + 1 + varint_len((uint64_t)klen) + klen + 1 +
              varint_len((uint64_t)blen) + blen + tail_n;
    l->hdr = 5 + varint_len(l->txn) + (priority ? 1 + varint_len(l->priority) : 0);
    l->frame = 4 + l->hdr + varint_len((uint64_t)l->part) + l->part;
    return l->frame <= 0xFFFFFFFFLL;
}

/* The frame at p up to its body's bytes: length, header (txn id, priority unless 0), ledger id, entry id,
 * master key, and the body's tag and length. Returns where the body goes. */
static unsigned char *
put_add_prefix(unsigned char *p, const AddLayout *l, const char *key)
{
    p[0] = (unsigned char)(l->frame >> 24);
    p[1] = (unsigned char)(l->frame >> 16);
    p[2] = (unsigned char)(l->frame >> 8);
    p[3] = (unsigned char)l->frame;
    p += 4;
    *p++ = 0x0a;
    *p++ = (unsigned char)l->hdr;
    memcpy(p, ADD_HEADER, 5);
    p += 5;
    p += varint_put(p, l->txn);
    if (l->priority) {
        *p++ = 0x20;
        p += varint_put(p, l->priority);
    }
    *p++ = 0xaa;
    *p++ = 0x06;
    p += varint_put(p, (uint64_t)l->part);
    *p++ = 0x08;
    p += varint_put(p, l->lid);
    *p++ = 0x10;
    p += varint_put(p, l->eid);
    *p++ = 0x1a;
    p += varint_put(p, (uint64_t)l->klen);
    memcpy(p, key, l->klen);
    p += l->klen;
    *p++ = 0x22;
    p += varint_put(p, (uint64_t)l->blen);
    return p;
}

static PyObject *
encode_add(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int ok = 1, recovery = 0;
    int64_t write_flags = 0, priority = 0;
    if (kwnames != NULL || nargs < 5 || nargs > 8 || !PyBytes_CheckExact(args[2]) ||
        !PyBytes_CheckExact(args[3])) {
        return call_fallback(encode_add_fallback, "encode_add", args, nargsf, kwnames);
    }
    int64_t lid = int64_arg(args[0], &ok);
    int64_t eid = int64_arg(args[1], &ok);
    int64_t txn = int64_arg(args[4], &ok);
    if (nargs > 5 && (recovery = PyObject_IsTrue(args[5])) < 0) {
        return NULL;
    }
    if (nargs > 6) {
        write_flags = int64_arg(args[6], &ok);
    }
    if (nargs > 7) {
        priority = int64_arg(args[7], &ok);
    }
    /* The Python encoder's range checks: it raises the errors. */
    if (!ok || txn < 0 || priority < 0 || priority >= ((int64_t)1 << 32) || write_flags < INT32_MIN ||
        write_flags > INT32_MAX) {
        return call_fallback(encode_add_fallback, "encode_add", args, nargsf, kwnames);
    }
    Py_ssize_t blen = PyBytes_GET_SIZE(args[3]);
    uint64_t uwf = (uint64_t)write_flags;
    Py_ssize_t tail_n = (write_flags ? 1 + varint_len(uwf) : 0) + (recovery ? 3 : 0);
    AddLayout l;
    if (!add_layout(&l, lid, eid, txn, priority, PyBytes_GET_SIZE(args[2]), blen, tail_n)) {
        return call_fallback(encode_add_fallback, "encode_add", args, nargsf, kwnames);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 + l.frame);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *p = put_add_prefix((unsigned char *)PyBytes_AS_STRING(out), &l, PyBytes_AS_STRING(args[2]));
    memcpy(p, PyBytes_AS_STRING(args[3]), blen);
    p += blen;
    if (write_flags) {
        *p++ = 0x28;
        p += varint_put(p, uwf);
    }
    if (recovery) {
        *p++ = 0xa0;
        *p++ = 0x06;
        *p++ = 0x01;
    }
    return out;
}

static PyObject *
set_encode_add_fallback(PyObject *self, PyObject *fn)
{
    Py_XSETREF(encode_add_fallback, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* --- the client: entry bodies with a CRC32C digest ------------------------------------------------------- */

/* CRC32C (Castagnoli, reflected 0x82F63B78), as the `crc32c` package computes it: the SSE 4.2 instruction
 * where the CPU has it, a table elsewhere. */
static uint32_t crc_table[256];

static void
crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        crc_table[i] = c;
    }
}

static uint32_t
crc32c_table(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    crc = ~crc;
    while (n--) {
        crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    }
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
static int crc_hw = 0;

__attribute__((target("sse4.2"))) static uint32_t
crc32c_sse42(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    uint64_t c = ~crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) {
        c32 = _mm_crc32_u8(c32, *p++);
    }
    return ~c32;
}

static uint32_t
crc32c(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    return crc_hw ? crc32c_sse42(crc, p, n) : crc32c_table(crc, p, n);
}
#else
static uint32_t
crc32c(uint32_t crc, const unsigned char *p, Py_ssize_t n)
{
    return crc32c_table(crc, p, n);
}
#endif

static void
put_be64(unsigned char *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    for (int i = 7; i >= 0; i--) {
        p[i] = (unsigned char)u;
        u >>= 8;
    }
}

#define ENTRY_HEAD_BYTES 36

/* The first ENTRY_HEAD_BYTES of a CRC32C entry body at p: header (ledger id, entry id, LAC, length:
 * big-endian int64s) and the CRC32C of header and payload (4 bytes, big-endian). The payload is only read. */
static void
put_entry_head(unsigned char *p, const int64_t fields[4], const unsigned char *payload, Py_ssize_t n)
{
    for (int i = 0; i < 4; i++) {
        put_be64(p + 8 * i, fields[i]);
    }
    uint32_t crc = crc32c(crc32c(0, p, 32), payload, n);
    p[32] = (unsigned char)(crc >> 24);
    p[33] = (unsigned char)(crc >> 16);
    p[34] = (unsigned char)(crc >> 8);
    p[35] = (unsigned char)crc;
}

/* The four int64 entry header fields from args[0:4]; 0 when one is not an exact int64. */
static int
entry_fields(PyObject *const *args, int64_t fields[4])
{
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        fields[i] = int64_arg(args[i], &ok);
    }
    return ok;
}

/* Entry head, payload: one entry body, one copy of the payload. */
static PyObject *
encode_entry_crc32c(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t fields[4];
    if (nargs != 5 || !PyBytes_CheckExact(args[4]) || !entry_fields(args, fields)) {
        return call_fallback(encode_entry_fallback, "encode_entry", args, (size_t)nargs, NULL);
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[4]);
    PyObject *out = PyBytes_FromStringAndSize(NULL, ENTRY_HEAD_BYTES + n);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(p + ENTRY_HEAD_BYTES, PyBytes_AS_STRING(args[4]), n);
    put_entry_head(p, fields, p + ENTRY_HEAD_BYTES, n);
    return out;
}

/* encode_add_head(ledger_id, entry_id, lac, length, payload, master_key, txn_id): the v3 ADD frame of the
 * CRC32C entry (ledger_id, entry_id, lac, length, payload) -- what encode_add makes of that body, with no
 * flags and priority 0 -- without its payload: frame == head + payload. The writer queues both pieces, so
 * the payload is copied once, into the connection's write, instead of into a body and then a frame. */
static PyObject *
encode_add_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t fields[4];
    int ok = 1;
    if (nargs != 7 || !PyBytes_CheckExact(args[4]) || !PyBytes_CheckExact(args[5]) ||
        !entry_fields(args, fields)) {
        return call_fallback(encode_add_head_fallback, "encode_add_head", args, (size_t)nargs, NULL);
    }
    int64_t txn = int64_arg(args[6], &ok);
    if (!ok || txn < 0) {
        return call_fallback(encode_add_head_fallback, "encode_add_head", args, (size_t)nargs, NULL);
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[4]);
    AddLayout l;
    if (!add_layout(&l, fields[0], fields[1], txn, 0, PyBytes_GET_SIZE(args[5]), ENTRY_HEAD_BYTES + n, 0)) {
        return call_fallback(encode_add_head_fallback, "encode_add_head", args, (size_t)nargs, NULL);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 + l.frame - n);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *p = put_add_prefix((unsigned char *)PyBytes_AS_STRING(out), &l, PyBytes_AS_STRING(args[5]));
    put_entry_head(p, fields, (const unsigned char *)PyBytes_AS_STRING(args[4]), n);
    return out;
}

/* encode_add_head_v2(ledger_id, entry_id, lac, length, payload, master_key): the same for a v2 ADD frame
 * (v2.encode_add of that body, not a recovery add): length, header, master key, entry head. */
static PyObject *
encode_add_head_v2(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t fields[4];
    if (nargs != 6 || !PyBytes_CheckExact(args[4]) || !PyBytes_CheckExact(args[5]) ||
        PyBytes_GET_SIZE(args[5]) != 20 || !entry_fields(args, fields)) {
        return call_fallback(encode_add_head_v2_fallback, "encode_add_head_v2", args, (size_t)nargs, NULL);
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[4]);
    Py_ssize_t frame = 4 + 20 + ENTRY_HEAD_BYTES + n;
    if (frame > 0xFFFFFFFFLL) {
        return call_fallback(encode_add_head_v2_fallback, "encode_add_head_v2", args, (size_t)nargs, NULL);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 + 20 + ENTRY_HEAD_BYTES);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    p[0] = (unsigned char)(frame >> 24);
    p[1] = (unsigned char)(frame >> 16);
    p[2] = (unsigned char)(frame >> 8);
    p[3] = (unsigned char)frame;
    /* Protocol version 2, ADD_ENTRY (1), no flags. */
    p[4] = 2;
    p[5] = 1;
    p[6] = 0;
    p[7] = 0;
    memcpy(p + 8, PyBytes_AS_STRING(args[5]), 20);
    put_entry_head(p + 28, fields, (const unsigned char *)PyBytes_AS_STRING(args[4]), n);
    return out;
}

static PyObject *
set_encode_add_head_fallbacks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_encode_add_head_fallbacks(v3, v2)");
        return NULL;
    }
    Py_XSETREF(encode_add_head_fallback, Py_NewRef(args[0]));
    Py_XSETREF(encode_add_head_v2_fallback, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyObject *
set_encode_entry_fallback(PyObject *self, PyObject *fn)
{
    Py_XSETREF(encode_entry_fallback, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* Tests: run the table instead of the instruction (as on a CPU without it); returns whether it was on. */
static PyObject *
set_crc_hardware(PyObject *self, PyObject *on)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    int was = crc_hw;
    int want = PyObject_IsTrue(on);
    if (want < 0) {
        return NULL;
    }
    crc_hw = want && __builtin_cpu_supports("sse4.2");
    return PyBool_FromLong(was);
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *
crc32c_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    unsigned long crc = 0;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32c(data, value=0) takes 1 or 2 arguments");
        return NULL;
    }
    if (nargs == 2 && (crc = PyLong_AsUnsignedLong(args[1])) == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    uint32_t value = crc32c((uint32_t)crc, view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(value);
}

/* --- building the frozen slotted dataclasses a reader gets (ReadResponse, Entry) ------------------------- */

/* Their Python `__init__` (_fastinit.py) is a Python frame and one slot-descriptor call per field: about
 * 0.6 µs per object here, as much as the parsing that fills it. A class given to this file is built the same
 * way from C: allocated, then every field's slot descriptor set in field order -- the object `__init__`
 * makes, with no Python frame. */
#define SLOTTED_MAX_FIELDS 8
typedef struct {
    PyTypeObject *type;
    PyObject *descrs[SLOTTED_MAX_FIELDS];
    Py_ssize_t n;
} slotted_t;

/* `cls` and the names of its fields in `__init__` order: 0, or -1 with an exception set. */
static int
slotted_set(slotted_t *s, PyObject *cls, PyObject *names)
{
    if (!PyType_Check(cls) || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) > SLOTTED_MAX_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "a class and a tuple of at most 8 field names");
        return -1;
    }
    PyObject *descrs[SLOTTED_MAX_FIELDS];
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyDict_GetItemWithError(((PyTypeObject *)cls)->tp_dict, PyTuple_GET_ITEM(names, i));
        if (d == NULL || Py_TYPE(d)->tp_descr_set == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "%R has no slot %R", cls, PyTuple_GET_ITEM(names, i));
            }
            for (Py_ssize_t j = 0; j < i; j++) {
                Py_DECREF(descrs[j]);
            }
            return -1;
        }
        descrs[i] = Py_NewRef(d);
    }
    for (Py_ssize_t i = 0; i < s->n; i++) {
        Py_CLEAR(s->descrs[i]);
    }
    Py_XSETREF(s->type, (PyTypeObject *)Py_NewRef(cls));
    for (Py_ssize_t i = 0; i < n; i++) {
        s->descrs[i] = descrs[i];
    }
    s->n = n;
    return 0;
}

/* A new instance with `values` (s->n of them, borrowed; NULL among them: an error is already set). */
static PyObject *
slotted_new(slotted_t *s, PyObject *const *values)
{
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (values[i] == NULL) {
            return NULL;
        }
    }
    PyObject *obj = s->type->tp_alloc(s->type, 0);
    if (obj == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (Py_TYPE(s->descrs[i])->tp_descr_set(s->descrs[i], obj, values[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

/* --- the client: READ answers -------------------------------------------------------------------------- */

/* Set once by v3.py (`set_read_response`): the ReadResponse class, the StatusCode member of each one-byte
 * status value (NULL: a status this build does not know), and the Python twin for bounds outside the buffer. */
static slotted_t read_response_type;
static PyObject *read_statuses[128];
static PyObject *read_response_fallback = NULL;

static const unsigned char READ_OK_HEADER[] = {0x08, 0x03, 0x10, 0x01, 0x18};

/* v3.read_response_at_py(data, start, end): the READ answer body at data[start:end], read in place, as a
 * ReadResponse, or None when it is not in the bookies' layout. Bounds outside the buffer go to the twin. */
static PyObject *
read_response_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t start, end;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "read_response_at(data, start, end) takes 3 arguments");
        return NULL;
    }
    if (read_response_type.type == NULL || read_response_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "read_response_at: set_read_response was not called");
        return NULL;
    }
    if ((start = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if ((end = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        return PyObject_Vectorcall(read_response_fallback, args, 3, NULL);
    }
    const unsigned char *p = (const unsigned char *)view.buf + start;
    Py_ssize_t avail = end - start, i, k, part_at, part_n;
    uint64_t txn, part_len, lid, eid, blen, max_lac = 0, lac_ts = 0;
    int has_body = 0, has_max_lac = 0, has_lac_ts = 0;
    unsigned char top, inner;
    PyObject *result = Py_None;
    /* header {version 3, READ_ENTRY, txnId}, status, then field 100: {status, ledgerId, entryId[, body]} */
    if (avail < 7 || p[0] != 0x0a || memcmp(p + 2, READ_OK_HEADER, 5) != 0) {
        goto none;
    }
    i = 7;
    if ((k = varint_upto(p + i, avail - i, 9, &txn)) == 0 || p[1] != 5 + k) {
        goto none;
    }
    i += k;
    if (avail - i < 4 || p[i] != 0x10 || p[i + 1] >= 0x80 || p[i + 2] != 0xa2 || p[i + 3] != 0x06) {
        goto none;
    }
    top = p[i + 1];
    i += 4;
    if ((part_n = varint_upto(p + i, avail - i, 4, &part_len)) == 0) {
        goto none;
    }
    part_at = i;
    i += part_n;
    if (avail - i < 3 || p[i] != 0x08 || p[i + 1] >= 0x80 || p[i + 2] != 0x10) {
        goto none;
    }
    inner = p[i + 1];
    i += 3;
    if ((k = varint_upto(p + i, avail - i, 9, &lid)) == 0) {
        goto none;
    }
    i += k;
    if (avail - i < 1 || p[i] != 0x18 || (k = varint_upto(p + i + 1, avail - i - 1, 9, &eid)) == 0) {
        goto none;
    }
    i += 1 + k;
    if (i < avail && p[i] == 0x22) {
        /* The body's length: if it is not a varint of at most 4 bytes, nothing after entryId can match. */
        if ((k = varint_upto(p + i + 1, avail - i - 1, 4, &blen)) == 0) {
            goto none;
        }
        has_body = 1;
        i += 1 + k;
    }
    if (read_statuses[top] == NULL || read_statuses[inner] == NULL) {
        goto none;
    }
    if (part_len != (uint64_t)(avail - part_at - part_n)) { /* the part runs to the end of the body */
        goto none;
    }
    Py_ssize_t body_at = i;
    if (has_body) {
        if (blen > (uint64_t)(avail - i)) {
            goto none;
        }
        i += (Py_ssize_t)blen;
    }
    if (i != avail && p[i] == 0x28) {
        if ((k = varint_upto(p + i + 1, avail - i - 1, 9, &max_lac)) == 0) {
            goto none;
        }
        has_max_lac = 1;
        i += 1 + k;
    }
    if (i != avail && p[i] == 0x30) {
        if ((k = varint_upto(p + i + 1, avail - i - 1, 9, &lac_ts)) == 0) {
            goto none;
        }
        has_lac_ts = 1;
        i += 1 + k;
    }
    if (i != avail) {
        goto none;
    }
    {
        PyObject *fields[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        fields[0] = Py_NewRef(top != 0 ? read_statuses[top] : read_statuses[inner]);
        fields[1] = PyLong_FromUnsignedLongLong(lid);
        fields[2] = PyLong_FromUnsignedLongLong(eid);
        fields[3] = has_body ? PyBytes_FromStringAndSize((const char *)p + body_at, (Py_ssize_t)blen)
                             : Py_NewRef(Py_None);
        fields[4] = has_max_lac ? PyLong_FromUnsignedLongLong(max_lac) : Py_NewRef(Py_None);
        fields[5] = has_lac_ts ? PyLong_FromUnsignedLongLong(lac_ts) : Py_NewRef(Py_None);
        fields[6] = PyLong_FromUnsignedLongLong(txn);
        result = slotted_new(&read_response_type, fields);
        for (int f = 0; f < 7; f++) {
            Py_XDECREF(fields[f]);
        }
        PyBuffer_Release(&view);
        return result;
    }
none:
    PyBuffer_Release(&view);
    return Py_NewRef(result);
}

/* set_read_response(cls, fields, statuses: dict[int, StatusCode], fallback): what read_response_at builds
 * (its seven fields' names, in order), and the Python twin it hands bounds outside the buffer. */
static PyObject *
set_read_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_Check(args[2]) || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 7) {
        PyErr_SetString(PyExc_TypeError, "set_read_response(cls, fields: 7-tuple, statuses: dict, fallback)");
        return NULL;
    }
    for (int v = 0; v < 128; v++) {
        PyObject *key = PyLong_FromLong(v);
        if (key == NULL) {
            return NULL;
        }
        PyObject *member = PyDict_GetItemWithError(args[2], key); /* borrowed */
        Py_DECREF(key);
        if (member == NULL && PyErr_Occurred()) {
            return NULL;
        }
        Py_XINCREF(member);
        Py_XSETREF(read_statuses[v], member);
    }
    if (read_statuses[0] == NULL) {
        PyErr_SetString(PyExc_ValueError, "set_read_response: statuses has no 0 (EOK)");
        return NULL;
    }
    if (slotted_set(&read_response_type, args[0], args[1]) < 0) {
        return NULL;
    }
    Py_XSETREF(read_response_fallback, Py_NewRef(args[3]));
    Py_RETURN_NONE;
}

/* Set once by entry.py (`set_entry_type`): the Entry class decode_entry_crc32c builds, and its fields. */
static slotted_t entry_type;

/* decode_entry_crc32c(body, ledger_id, entry_id=None) -> Entry or None: a CRC32C entry body verified and
 * split, as entry.DigestManager.decode_entry does it, when everything checks out (the ids match, the digest
 * is right); None for anything else, and that function's Python path then raises the precise error. */
static PyObject *
decode_entry_crc32c(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    int64_t want_lid, want_eid = 0;
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "decode_entry_crc32c(body, ledger_id, entry_id=None)");
        return NULL;
    }
    if (entry_type.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_entry_crc32c: set_entry_type was not called");
        return NULL;
    }
    int check_eid = nargs == 3 && args[2] != Py_None, ok = 1;
    want_lid = int64_arg(args[1], &ok);
    if (check_eid) {
        want_eid = int64_arg(args[2], &ok);
    }
    if (!ok) {
        Py_RETURN_NONE; /* not an exact int64: the Python path decides */
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE; /* not a buffer: the Python path says what is wrong */
    }
    const unsigned char *p = view.buf;
    PyObject *result = Py_None;
    if (view.len < 36) {
        goto done;
    }
    int64_t lid = be64(p), eid = be64(p + 8);
    if (lid != want_lid || (check_eid && eid != want_eid)) {
        goto done;
    }
    uint32_t digest = ((uint32_t)p[32] << 24) | ((uint32_t)p[33] << 16) | ((uint32_t)p[34] << 8) | p[35];
    if (crc32c(crc32c(0, p, 32), p + 36, view.len - 36) != digest) {
        goto done;
    }
    PyObject *fields[5] = {PyLong_FromLongLong(lid), PyLong_FromLongLong(eid), PyLong_FromLongLong(be64(p + 16)),
                           PyLong_FromLongLong(be64(p + 24)),
                           PyBytes_FromStringAndSize((const char *)p + 36, view.len - 36)};
    result = slotted_new(&entry_type, fields);
    for (int f = 0; f < 5; f++) {
        Py_XDECREF(fields[f]);
    }
    PyBuffer_Release(&view);
    return result;
done:
    PyBuffer_Release(&view);
    return Py_NewRef(result);
}

static PyObject *
set_entry_type(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 5) {
        PyErr_SetString(PyExc_TypeError, "set_entry_type(cls, fields: 5-tuple)");
        return NULL;
    }
    if (slotted_set(&entry_type, args[0], args[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* --- plain READs: the reader's request, the bookie's reading of it and its answer ------------------------- */

static PyObject *encode_read_fallback = NULL;
static PyObject *decode_read_fallback = NULL;

/* An int64 field's varint (a negative value sign-extended to 10 bytes, as protobuf writes int64). */
static Py_ssize_t
varint_put_i64(unsigned char *p, int64_t v)
{
    return varint_put(p, (uint64_t)v);
}

/* encode_read(ledger_id, entry_id, txn_id): v3fast.encode_read_py's frame; anything but ints in range
 * (int64 ids, a txn id in [0, 2**64)) goes to that function, which raises its error. */
static PyObject *
encode_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t lid, eid;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_read(ledger_id, entry_id, txn_id) takes 3 arguments");
        return NULL;
    }
    if (encode_read_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode_read: set_read_fallbacks was not called");
        return NULL;
    }
    unsigned long long txn = (unsigned long long)-1;
    if (PyLong_Check(args[2])) {
        txn = PyLong_AsUnsignedLongLong(args[2]);
        if (txn == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return PyObject_Vectorcall(encode_read_fallback, args, 3, NULL);
        }
    }
    int ok = PyLong_Check(args[2]);
    lid = int64_arg(args[0], &ok);
    eid = int64_arg(args[1], &ok);
    if (!ok) {
        return PyObject_Vectorcall(encode_read_fallback, args, 3, NULL);
    }
    unsigned char t[10], l[10], e[10];
    Py_ssize_t tn = varint_put(t, txn), ln = varint_put_i64(l, lid), en = varint_put_i64(e, eid);
    Py_ssize_t part = 2 + ln + en; /* at most 22: one byte */
    Py_ssize_t total = 4 + 10 + tn + part;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t body = total - 4;
    o[0] = (unsigned char)(body >> 24);
    o[1] = (unsigned char)(body >> 16);
    o[2] = (unsigned char)(body >> 8);
    o[3] = (unsigned char)body;
    o[4] = 0x0a;
    o[5] = (unsigned char)(5 + tn);
    memcpy(o + 6, READ_OK_HEADER, 5);
    memcpy(o + 11, t, tn);
    Py_ssize_t i = 11 + tn;
    o[i++] = 0xa2;
    o[i++] = 0x06;
    o[i++] = (unsigned char)part;
    o[i++] = 0x08;
    memcpy(o + i, l, ln);
    i += ln;
    o[i++] = 0x10;
    memcpy(o + i, e, en);
    return out;
}

/* decode_read_v3(data, start=0, end=None): server_codec.decode_read_v3_py -- the plain READ in data[start:end]
 * as (txn_raw, ledger_raw, entry_raw, ledger_id, entry_id), or None. Bounds outside the buffer go to it. */
static PyObject *
decode_read_v3(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t start = 0, end;
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "decode_read_v3(data, start=0, end=None)");
        return NULL;
    }
    if (decode_read_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_read_v3: set_decode_read_fallback was not called");
        return NULL;
    }
    if (nargs >= 2 && (start = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    end = view.len;
    if (nargs == 3 && args[2] != Py_None && (end = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        return PyObject_Vectorcall(decode_read_fallback, args, nargs, NULL);
    }
    const unsigned char *p = (const unsigned char *)view.buf + start;
    Py_ssize_t avail = end - start, i, tn, ln, en;
    uint64_t txn, lid, eid;
    PyObject *result = Py_None;
    if (avail < 7 || p[0] != 0x0a || memcmp(p + 2, READ_OK_HEADER, 5) != 0) {
        goto done;
    }
    i = 7;
    if ((tn = varint_canonical(p + i, avail - i, &txn)) == 0) {
        goto done;
    }
    i += tn;
    if (avail - i < 4 || p[i] != 0xa2 || p[i + 1] != 0x06 || p[i + 3] != 0x08) {
        goto done;
    }
    unsigned char part = p[i + 2];
    i += 4;
    if ((ln = varint_canonical(p + i, avail - i, &lid)) == 0) {
        goto done;
    }
    i += ln;
    if (avail - i < 1 || p[i] != 0x10 || (en = varint_canonical(p + i + 1, avail - i - 1, &eid)) == 0) {
        goto done;
    }
    i += 1 + en;
    if (i != avail || p[1] != 5 + tn || part != 2 + ln + en) {
        goto done;
    }
    result = Py_BuildValue("(y#y#y#KK)", p + 7, tn, p + 7 + tn + 4, ln, p + 7 + tn + 4 + ln + 1, en,
                           (unsigned long long)lid, (unsigned long long)eid);
    PyBuffer_Release(&view);
    return result;
done:
    PyBuffer_Release(&view);
    return Py_NewRef(result);
}

static PyObject *encode_read_ok_fallback = NULL;

/* encode_read_ok(txn, ledger, entry, body, lac): v3fast.encode_read_ok_py -- the EOK answer frame to a plain
 * READ, from the request's varints as received. Anything but bytes and an int64 lac goes to that function. */
static PyObject *
encode_read_ok(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t lac;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "encode_read_ok(txn, ledger, entry, body, lac) takes 5 arguments");
        return NULL;
    }
    if (encode_read_ok_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "encode_read_ok: set_read_fallbacks was not called");
        return NULL;
    }
    PyObject *txn = args[0], *ledger = args[1], *entry = args[2], *body = args[3];
    int ok = 1;
    lac = int64_arg(args[4], &ok);
    if (!ok || !PyBytes_CheckExact(txn) || !PyBytes_CheckExact(ledger) || !PyBytes_CheckExact(entry) ||
        !PyBytes_CheckExact(body) || 5 + PyBytes_GET_SIZE(txn) >= 0x80) {
        return PyObject_Vectorcall(encode_read_ok_fallback, args, 5, NULL);
    }
    Py_ssize_t tn = PyBytes_GET_SIZE(txn), ln = PyBytes_GET_SIZE(ledger), en = PyBytes_GET_SIZE(entry);
    Py_ssize_t bn = PyBytes_GET_SIZE(body);
    unsigned char blen[10], maxlac[10], plen[10];
    Py_ssize_t bln = varint_put(blen, (uint64_t)bn), mln = varint_put_i64(maxlac, lac);
    Py_ssize_t part = 6 + ln + en + bln + bn + mln;
    Py_ssize_t pln = varint_put(plen, (uint64_t)part);
    Py_ssize_t hdr = 5 + tn;
    Py_ssize_t frame = 6 + hdr + pln + part; /* the body after the 4-byte length */
    if (frame > 0xFFFFFFFF) {
        return PyObject_Vectorcall(encode_read_ok_fallback, args, 5, NULL);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 + frame);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    o[0] = (unsigned char)(frame >> 24);
    o[1] = (unsigned char)(frame >> 16);
    o[2] = (unsigned char)(frame >> 8);
    o[3] = (unsigned char)frame;
    o[4] = 0x0a;
    o[5] = (unsigned char)hdr;
    memcpy(o + 6, READ_OK_HEADER, 5);
    Py_ssize_t i = 11;
    memcpy(o + i, PyBytes_AS_STRING(txn), tn);
    i += tn;
    o[i++] = 0x10;
    o[i++] = 0x00;
    o[i++] = 0xa2;
    o[i++] = 0x06;
    memcpy(o + i, plen, pln);
    i += pln;
    o[i++] = 0x08;
    o[i++] = 0x00;
    o[i++] = 0x10;
    memcpy(o + i, PyBytes_AS_STRING(ledger), ln);
    i += ln;
    o[i++] = 0x18;
    memcpy(o + i, PyBytes_AS_STRING(entry), en);
    i += en;
    o[i++] = 0x22;
    memcpy(o + i, blen, bln);
    i += bln;
    memcpy(o + i, PyBytes_AS_STRING(body), bn);
    i += bn;
    o[i++] = 0x28;
    memcpy(o + i, maxlac, mln);
    return out;
}

/* set_read_fallbacks(encode_read, encode_read_ok): the Python twins (v3fast), for what is not done here. */
static PyObject *
set_read_fallbacks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_read_fallbacks(encode_read, encode_read_ok)");
        return NULL;
    }
    Py_XSETREF(encode_read_fallback, Py_NewRef(args[0]));
    Py_XSETREF(encode_read_ok_fallback, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* set_decode_read_fallback(decode_read_v3): its Python twin (server_codec), for bounds outside the buffer. */
static PyObject *
set_decode_read_fallback(PyObject *self, PyObject *fn)
{
    Py_XSETREF(decode_read_fallback, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan_add_ok", (PyCFunction)(void (*)(void))scan_add_ok, METH_FASTCALL,
     "Append (txn, lid_raw, eid_raw) of each whole EOK AddResponse frame from pos on; return where they end."},
    {"deliver_add_oks", (PyCFunction)(void (*)(void))deliver_add_oks, METH_FASTCALL,
     "Deliver the EOK AddResponses at data[pos:] to their writers' waiters; return where it stopped."},
    {"deliver_v2_add_oks", (PyCFunction)(void (*)(void))deliver_v2_add_oks, METH_FASTCALL,
     "Deliver the v2 EOK ADD answers at data[pos:] to their writers' waiters; return where it stopped."},
    {"set_add_answer", (PyCFunction)(void (*)(void))set_add_answer, METH_FASTCALL,
     "Register WriteHandle._on_add_answer and its types for the acks counted in C (or None: off)."},
    {"encode_add_oks", encode_add_oks, METH_O, "The EOK answers to a batch of FastAdds, joined (or None)."},
    {"add_records", add_records, METH_O, "(ADD record header, body) per entry body (or None)."},
    {"untrack_tuples", untrack_tuples, METH_O, "Untrack the list's tuples that hold nothing the GC tracks."},
    {"scan_adds_v3", (PyCFunction)(void (*)(void))scan_adds_v3, METH_FASTCALL,
     "Append the FastAdd of each whole canonical v3 add frame from pos on; return where they end."},
    {"scan_adds_v2", (PyCFunction)(void (*)(void))scan_adds_v2, METH_FASTCALL,
     "Append the FastAdd of each whole v2 ADD frame without flags from pos on; return where they end."},
    {"decode_add_v3", (PyCFunction)(void (*)(void))decode_add_v3, METH_FASTCALL,
     "The FastAdd of a canonical v3 add frame body, or None."},
    {"encode_add", (PyCFunction)(void (*)(void))encode_add, METH_FASTCALL | METH_KEYWORDS,
     "The v3 frame of an AddRequest from its fields."},
    {"set_encode_add_fallback", set_encode_add_fallback, METH_O,
     "The Python encode_add, called for what this module does not encode itself."},
    {"encode_entry_crc32c", (PyCFunction)(void (*)(void))encode_entry_crc32c, METH_FASTCALL,
     "An entry body with a CRC32C digest: header, digest, payload."},
    {"encode_add_head", (PyCFunction)(void (*)(void))encode_add_head, METH_FASTCALL,
     "The v3 ADD frame of a CRC32C entry without its payload (frame == head + payload)."},
    {"encode_add_head_v2", (PyCFunction)(void (*)(void))encode_add_head_v2, METH_FASTCALL,
     "The v2 ADD frame of a CRC32C entry without its payload (frame == head + payload)."},
    {"set_encode_add_head_fallbacks", (PyCFunction)(void (*)(void))set_encode_add_head_fallbacks, METH_FASTCALL,
     "The Python head encoders (v3, v2), called for what this module does not encode itself."},
    {"set_encode_entry_fallback", set_encode_entry_fallback, METH_O,
     "The Python entry encoder, called for what this module does not encode itself."},
    {"set_crc_hardware", set_crc_hardware, METH_O,
     "Use the CPU's CRC32C instruction (where it has one) or the table; returns the previous setting."},
    {"read_response_at", (PyCFunction)(void (*)(void))read_response_at, METH_FASTCALL,
     "The READ answer body at data[start:end] as a ReadResponse, or None if not in the bookies' layout."},
    {"set_read_response", (PyCFunction)(void (*)(void))set_read_response, METH_FASTCALL,
     "The ReadResponse class and its field names, the StatusCode by value, the Python twin (read_response_at)."},
    {"decode_entry_crc32c", (PyCFunction)(void (*)(void))decode_entry_crc32c, METH_FASTCALL,
     "A CRC32C entry body verified and split into an Entry, or None if anything does not check out."},
    {"set_entry_type", (PyCFunction)(void (*)(void))set_entry_type, METH_FASTCALL,
     "The Entry class decode_entry_crc32c builds, and its field names in order."},
    {"encode_read", (PyCFunction)(void (*)(void))encode_read, METH_FASTCALL,
     "The v3 frame of a plain READ of (ledger_id, entry_id) with txn_id."},
    {"decode_read_v3", (PyCFunction)(void (*)(void))decode_read_v3, METH_FASTCALL,
     "The plain v3 READ in data[start:end] as (txn_raw, ledger_raw, entry_raw, ledger_id, entry_id), or None."},
    {"encode_read_ok", (PyCFunction)(void (*)(void))encode_read_ok, METH_FASTCALL,
     "The EOK answer frame to a plain READ, from its varints as received."},
    {"set_read_fallbacks", (PyCFunction)(void (*)(void))set_read_fallbacks, METH_FASTCALL,
     "The Python encode_read and encode_read_ok, for what this module does not encode itself."},
    {"set_decode_read_fallback", set_decode_read_fallback, METH_O,
     "The Python decode_read_v3, for bounds outside the buffer."},
    {"crc32c", (PyCFunction)(void (*)(void))crc32c_py, METH_FASTCALL,
     "CRC32C of data, continuing from value (tests compare it with the crc32c package)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "quorumlog.proto._speedups", "Compiled twins of the per-entry codec steps.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    crc_table_init();
    str_pending_count = PyUnicode_InternFromString("pending_count");
    int_one = PyLong_FromLong(1);
    if (str_pending_count == NULL || int_one == NULL) {
        return NULL;
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
    return PyModule_Create(&module);
}
