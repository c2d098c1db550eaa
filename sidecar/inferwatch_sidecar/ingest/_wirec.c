/*
 * The sidecar's compiled loop over a wire frame's records (issue 23, item 8).
 *
 * A drop-in for the SDK's generated loop (inferwatch.wire._codegen_decode.decoder): the same
 * arguments, (dec, buf, off, n_rec, strings, pkey), and the same result, (records, errors).
 * It reads the three record types that carry the traffic (REQUEST with plain stages, RECORD,
 * HTTP) itself. Every other record, and any of those three that is not exactly what the fast
 * path expects (a bad reference, an unknown schema, a length that does not add up, a stream's
 * stages), goes whole to the generated Python loop for that one record, which reads it, or hands
 * it to the general decoder, exactly as it would have. So the records and error reasons are the
 * Python decoder's by construction; tests/ingest/test_wirec.py checks it on random and mutated frames.
 *
 * Every read is bounded by the record's own end, which is bounded by the buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define EV_REQUEST 2
#define EV_RECORD 5
#define EV_HTTP 10
#define NONE_REF 0xFFFF
#define OUTCOME_MAX 4
#define STAGE_SIZE 11
#define CTX_CACHE 16

/* The generated Python loop: what reads every record this file does not. Set by configure(). */
static PyObject *fallback_loop = NULL;
static PyObject *str_truncated = NULL;
static PyObject *str_schemas = NULL;
static PyObject *struct_type = NULL; /* struct.Struct */

static inline uint16_t u16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline uint32_t u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t u64(const unsigned char *p) { return (uint64_t)u32(p) | ((uint64_t)u32(p + 4) << 32); }

static inline double f64(const unsigned char *p) {
    uint64_t v = u64(p);
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

/* A tuple of str, float, int, bytes or None cannot be part of a cycle: the collector need not walk it, and
 * CPython untracks such tuples itself, but only once a collection has walked them (staged events live for a
 * worker's tick, so most meet one). Only for tuples built here from such values. */
static inline PyObject *atomic(PyObject *t) {
    if (t != NULL && PyObject_GC_IsTracked(t)) {
        PyObject_GC_UnTrack(t);
    }
    return t;
}

/* A tuple none of whose items the collector tracks cannot be part of a cycle either (CPython's own rule for
 * untracking tuples): untrack it now. For the records themselves, once their parts are untracked. */
static inline PyObject *flat(PyObject *t) {
    if (t == NULL || !PyObject_GC_IsTracked(t)) {
        return t;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        PyObject *o = PyTuple_GET_ITEM(t, i);
        if (PyObject_IS_GC(o) && PyObject_GC_IsTracked(o)) {
            return t;
        }
    }
    PyObject_GC_UnTrack(t);
    return t;
}

/* A wire Schema is (id, numeric names, categorical names, struct.Struct, struct.Struct). A Struct holds its
 * format and codes only, so nothing it refers to can refer back: no cycle can pass through a schema whose
 * other items are untracked. Untracked, it lets the features tuples and RECORD records that share it be
 * untracked too (otherwise every RECORD would stay on the collector's list for as long as it is staged). */
static void untrack_schema(PyObject *schema) {
    if (!PyObject_GC_IsTracked(schema)) {
        return;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(schema); i++) {
        PyObject *o = PyTuple_GET_ITEM(schema, i);
        if (PyTuple_CheckExact(o)) {
            flat(o);
        }
        if (PyObject_IS_GC(o) && PyObject_GC_IsTracked(o) && Py_TYPE(o) != (PyTypeObject *)struct_type) {
            return;
        }
    }
    PyObject_GC_UnTrack(schema);
}

/* Per call: the frame's state the records share. */
typedef struct {
    const unsigned char *buf;
    PyObject *strings;  /* list of str (borrowed) */
    Py_ssize_t n_strings;
    PyObject *schemas;  /* dec._schemas (owned) */
    PyObject *pkey;     /* borrowed */
    uint64_t ctx_keys[CTX_CACHE];
    PyObject *ctx_vals[CTX_CACHE]; /* owned */
    int n_ctx;
    long long last_sid; /* -1: none cached */
    PyObject *schema;   /* owned, the schema of last_sid */
    Py_ssize_t n_num, n_cat;
} WireFrame;

/* A string-table reference as a new reference: None for NONE_REF; NULL (no error set) when out of range. */
static inline PyObject *ref_or_none(WireFrame *f, unsigned r) {
    if (r == NONE_REF) {
        Py_RETURN_NONE;
    }
    if ((Py_ssize_t)r >= f->n_strings) {
        return NULL;
    }
    PyObject *s = PyList_GET_ITEM(f->strings, r);
    Py_INCREF(s);
    return s;
}

/* A string-table reference that must name a string (new reference); NULL (no error set) otherwise. */
static inline PyObject *ref_strict(WireFrame *f, unsigned r) {
    if ((Py_ssize_t)r >= f->n_strings) {
        return NULL;
    }
    PyObject *s = PyList_GET_ITEM(f->strings, r);
    Py_INCREF(s);
    return s;
}

/* A ctx tuple (new reference) for the three refs at p, shared by the frame's records; NULL: fall back. */
static PyObject *ctx_of(WireFrame *f, const unsigned char *p) {
    uint64_t key = (uint64_t)u16(p) | ((uint64_t)u16(p + 2) << 16) | ((uint64_t)u16(p + 4) << 32);
    for (int i = 0; i < f->n_ctx; i++) {
        if (f->ctx_keys[i] == key) {
            Py_INCREF(f->ctx_vals[i]);
            return f->ctx_vals[i];
        }
    }
    PyObject *t = PyTuple_New(3);
    if (t == NULL) {
        return NULL;
    }
    for (int j = 0; j < 3; j++) {
        PyObject *s = ref_or_none(f, u16(p + 2 * j));
        if (s == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, j, s);
    }
    atomic(t);
    if (f->n_ctx < CTX_CACHE) {
        f->ctx_keys[f->n_ctx] = key;
        Py_INCREF(t);
        f->ctx_vals[f->n_ctx++] = t;
    }
    return t;
}

/* A request ID (u8 length, UTF-8) at *p, as str or None; advances *p. NULL: fall back. */
static PyObject *rid_at(const unsigned char *buf, Py_ssize_t *p, Py_ssize_t end) {
    Py_ssize_t q = *p;
    if (q >= end) {
        return NULL;
    }
    unsigned ln = buf[q];
    if (ln == 0) {
        *p = q + 1;
        Py_RETURN_NONE;
    }
    if (q + 1 + (Py_ssize_t)ln > end) {
        return NULL;
    }
    *p = q + 1 + ln;
    return PyUnicode_DecodeUTF8((const char *)buf + q + 1, ln, NULL);
}

/* A tagged value at *p: None, a float or a string-table str; advances *p. NULL: fall back. */
static PyObject *value_at(WireFrame *f, Py_ssize_t *p, Py_ssize_t end) {
    const unsigned char *buf = f->buf;
    Py_ssize_t q = *p;
    if (q >= end) {
        return NULL;
    }
    switch (buf[q]) {
    case 0:
        *p = q + 1;
        Py_RETURN_NONE;
    case 1:
        if (q + 9 > end) {
            return NULL;
        }
        *p = q + 9;
        return PyFloat_FromDouble(f64(buf + q + 1));
    case 2:
        if (q + 3 > end) {
            return NULL;
        }
        *p = q + 3;
        return ref_strict(f, u16(buf + q + 1));
    default:
        return NULL;
    }
}

/* Build a tuple from n new references (stolen); NULL if any is NULL (the others released). */
static PyObject *pack(Py_ssize_t n, PyObject **items) {
    PyObject *t = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i] == NULL) {
            goto fail;
        }
    }
    t = PyTuple_New(n);
    if (t == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
fail:
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(items[i]);
    }
    return NULL;
}

/* The features of a RECORD with schema ``sid`` at *p: (schema, nums, cats); NULL: fall back. */
static PyObject *features_at(WireFrame *f, long long sid, Py_ssize_t *p, Py_ssize_t end) {
    if (sid != f->last_sid) {
        PyObject *k = PyLong_FromLongLong(sid);
        if (k == NULL) {
            return NULL;
        }
        PyObject *key = PyNumber_Or(f->pkey, k);
        Py_DECREF(k);
        if (key == NULL) {
            return NULL;
        }
        PyObject *schema = PyDict_GetItemWithError(f->schemas, key); /* borrowed */
        Py_DECREF(key);
        if (schema == NULL || !PyTuple_Check(schema) || PyTuple_GET_SIZE(schema) < 3
                || !PyTuple_Check(PyTuple_GET_ITEM(schema, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(schema, 2))) {
            return NULL;
        }
        untrack_schema(schema);
        Py_INCREF(schema);
        Py_XSETREF(f->schema, schema);
        f->last_sid = sid;
        f->n_num = PyTuple_GET_SIZE(PyTuple_GET_ITEM(schema, 1));
        f->n_cat = PyTuple_GET_SIZE(PyTuple_GET_ITEM(schema, 2));
    }
    Py_ssize_t q = *p, nn = f->n_num, nc = f->n_cat;
    if (q + 8 * nn + 2 * nc > end) {
        return NULL;
    }
    const unsigned char *buf = f->buf;
    PyObject *nums = PyTuple_New(nn);
    if (nums == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nn; i++) {
        PyObject *v = PyFloat_FromDouble(f64(buf + q + 8 * i));
        if (v == NULL) {
            Py_DECREF(nums);
            return NULL;
        }
        PyTuple_SET_ITEM(nums, i, v);
    }
    atomic(nums);
    q += 8 * nn;
    PyObject *cats = PyTuple_New(nc);
    if (cats == NULL) {
        Py_DECREF(nums);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nc; i++) {
        PyObject *v = ref_or_none(f, u16(buf + q + 2 * i));
        if (v == NULL) {
            Py_DECREF(nums);
            Py_DECREF(cats);
            return NULL;
        }
        PyTuple_SET_ITEM(cats, i, v);
    }
    atomic(cats);
    *p = q + 2 * nc;
    Py_INCREF(f->schema);
    PyObject *items[3] = {f->schema, nums, cats};
    return flat(pack(3, items));
}

/* RECORD: (5, ctx, unix_ns, rid, prediction, confidence, label, features). */
static PyObject *read_record(WireFrame *f, Py_ssize_t start, Py_ssize_t end) {
    const unsigned char *buf = f->buf;
    Py_ssize_t p = start + 22;
    if (p > end) {
        return NULL;
    }
    const unsigned char *h = buf + start + 3;
    long long sid = (long long)u32(h + 14);
    PyObject *it[8] = {NULL};
    it[0] = PyLong_FromLong(EV_RECORD);
    it[1] = ctx_of(f, h);
    it[2] = PyLong_FromLongLong((long long)u64(h + 6));
    p = start + 21; /* the rid's length byte */
    it[3] = rid_at(buf, &p, end);
    if (it[3] != NULL) {
        it[4] = value_at(f, &p, end);
    }
    if (it[4] != NULL && p + 8 <= end) {
        double conf = f64(buf + p);
        p += 8;
        if (conf != conf) {
            Py_INCREF(Py_None);
            it[5] = Py_None;
        } else {
            it[5] = PyFloat_FromDouble(conf);
        }
        if (it[5] != NULL) {
            it[6] = value_at(f, &p, end);
        }
        if (it[6] != NULL) {
            if (sid) {
                it[7] = features_at(f, sid, &p, end);
            } else {
                Py_INCREF(Py_None);
                it[7] = Py_None;
            }
        }
    }
    if (it[7] != NULL && p != end) {
        Py_CLEAR(it[7]);
    }
    return flat(pack(8, it));
}

/* Plain stages (no flag set) as ((name, dur, None), ...), untracked; Py_None returned (new ref) when a flag is set. */
static PyObject *plain_stages(WireFrame *f, Py_ssize_t p, Py_ssize_t end, unsigned n) {
    const unsigned char *buf = f->buf;
    if (p + (Py_ssize_t)n * STAGE_SIZE > end) {
        return NULL;
    }
    for (unsigned i = 0; i < n; i++) {
        if (buf[p + i * STAGE_SIZE + 10]) {
            Py_RETURN_NONE;
        }
    }
    PyObject *out = PyTuple_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (unsigned i = 0; i < n; i++) {
        const unsigned char *s = buf + p + i * STAGE_SIZE;
        PyObject *it[3];
        it[0] = ref_strict(f, u16(s));
        it[1] = PyLong_FromUnsignedLongLong(u64(s + 2));
        Py_INCREF(Py_None);
        it[2] = Py_None;
        PyObject *t = atomic(pack(3, it));
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, t);
    }
    return flat(out);
}

/* REQUEST: (2, ctx, end_ns, duration_ns, outcome, error_type, rid, trace_id, stages); a stream's stages fall back. */
static PyObject *read_request(WireFrame *f, Py_ssize_t start, Py_ssize_t end) {
    const unsigned char *buf = f->buf;
    if (start + 30 > end) {
        return NULL;
    }
    const unsigned char *h = buf + start + 3;
    unsigned outcome = h[22];
    if (outcome > OUTCOME_MAX) {
        return NULL;
    }
    unsigned n_stages = h[25];
    PyObject *it[9] = {NULL};
    it[0] = PyLong_FromLong(EV_REQUEST);
    it[1] = ctx_of(f, h);
    it[2] = PyLong_FromLongLong((long long)u64(h + 6));
    it[3] = PyLong_FromUnsignedLongLong(u64(h + 14));
    it[4] = PyLong_FromLong((long)outcome);
    it[5] = ref_or_none(f, u16(h + 23));
    Py_ssize_t p = start + 29;
    it[6] = rid_at(buf, &p, end);
    if (it[6] != NULL && p < end) {
        unsigned tl = buf[p];
        if (tl == 0) {
            Py_INCREF(Py_None);
            it[7] = Py_None;
            p += 1;
        } else if (p + 1 + (Py_ssize_t)tl <= end) {
            it[7] = PyBytes_FromStringAndSize((const char *)buf + p + 1, tl);
            p += 1 + tl;
        }
    }
    if (it[7] != NULL) {
        if (n_stages == 0) {
            it[8] = PyTuple_New(0);
        } else {
            it[8] = plain_stages(f, p, end, n_stages);
            if (it[8] == Py_None) {
                Py_CLEAR(it[8]);
            }
            p += (Py_ssize_t)n_stages * STAGE_SIZE;
        }
    }
    if (it[8] != NULL && p != end) {
        Py_CLEAR(it[8]);
    }
    return flat(pack(9, it));
}

/* HTTP: (10, ctx, end_ns, route, status, outcome, resend_count, client_wait_ns, excluded, rid). */
static PyObject *read_http(WireFrame *f, Py_ssize_t start, Py_ssize_t end) {
    const unsigned char *buf = f->buf;
    if (start + 38 > end) {
        return NULL;
    }
    const unsigned char *h = buf + start + 3;
    unsigned outcome = h[20];
    if (outcome > OUTCOME_MAX) {
        return NULL;
    }
    PyObject *it[10] = {NULL};
    it[0] = PyLong_FromLong(EV_HTTP);
    it[1] = ctx_of(f, h);
    it[2] = PyLong_FromLongLong((long long)u64(h + 6));
    it[3] = ref_or_none(f, u16(h + 14));
    it[4] = PyLong_FromUnsignedLong(u32(h + 16));
    it[5] = PyLong_FromLong((long)outcome);
    it[6] = PyLong_FromUnsignedLong(u32(h + 21));
    it[7] = PyLong_FromUnsignedLongLong(u64(h + 25));
    it[8] = PyBool_FromLong(h[33]);
    Py_ssize_t p = start + 37;
    it[9] = rid_at(buf, &p, end);
    if (it[9] != NULL && p != end) {
        Py_CLEAR(it[9]);
    }
    /* HTTP's fields are all atomic but its ctx, itself an untracked tuple of str. */
    return atomic(pack(10, it));
}

static void frame_clear(WireFrame *f) {
    for (int i = 0; i < f->n_ctx; i++) {
        Py_DECREF(f->ctx_vals[i]);
    }
    f->n_ctx = 0;
    Py_CLEAR(f->schema);
    Py_CLEAR(f->schemas);
}

/* One record through the generated Python loop; its records and errors appended to ours. 0 ok, -1 error. */
static int fall_back(PyObject *const *args, Py_ssize_t start, PyObject *records, PyObject *errors) {
    PyObject *off = PyLong_FromSsize_t(start);
    if (off == NULL) {
        return -1;
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL) {
        Py_DECREF(off);
        return -1;
    }
    PyObject *call[6] = {args[0], args[1], off, one, args[4], args[5]};
    PyObject *got = PyObject_Vectorcall(fallback_loop, call, 6, NULL);
    Py_DECREF(off);
    Py_DECREF(one);
    if (got == NULL) {
        return -1;
    }
    int rc = -1;
    if (PyTuple_Check(got) && PyTuple_GET_SIZE(got) == 2 && PyList_Check(PyTuple_GET_ITEM(got, 0))
            && PyList_Check(PyTuple_GET_ITEM(got, 1))) {
        PyObject *r = PyTuple_GET_ITEM(got, 0), *e = PyTuple_GET_ITEM(got, 1);
        rc = 0;
        if (PyList_GET_SIZE(r) && PyList_SetSlice(records, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, r) < 0) {
            rc = -1;
        }
        if (rc == 0 && PyList_GET_SIZE(e) && PyList_SetSlice(errors, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, e) < 0) {
            rc = -1;
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "the fallback loop must return (records, errors) lists");
    }
    Py_DECREF(got);
    return rc;
}

PyDoc_STRVAR(records_doc,
"records(dec, buf, off, n_rec, strings, pkey) -> (records, errors)\n\n"
"The records of a frame from ``off`` on: the SDK's generated loop's result, faster (see the module).");

static PyObject *records_fn(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "records() takes 6 arguments: dec, buf, off, n_rec, strings, pkey");
        return NULL;
    }
    if (fallback_loop == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyBytes_Check(args[1]) || !PyList_Check(args[4]) || !PyLong_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "records() takes bytes, a list of strings and an int key");
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[2]);
    Py_ssize_t n_rec = PyLong_AsSsize_t(args[3]);
    if ((off == -1 || n_rec == -1) && PyErr_Occurred()) {
        return NULL;
    }
    WireFrame f;
    memset(&f, 0, sizeof f);
    f.buf = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    f.strings = args[4];
    f.pkey = args[5];
    f.last_sid = -1;
    f.schemas = PyObject_GetAttr(args[0], str_schemas);
    if (f.schemas == NULL) {
        return NULL;
    }
    if (!PyDict_Check(f.schemas)) {
        Py_DECREF(f.schemas);
        PyErr_SetString(PyExc_TypeError, "the decoder's _schemas must be a dict");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(args[1]);
    PyObject *records = PyList_New(0), *errors = PyList_New(0);
    if (records == NULL || errors == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n_rec; i++) {
        if (off < 0 || off + 3 > n) {
            if (PyList_Append(errors, str_truncated) < 0) {
                goto fail;
            }
            break;
        }
        const unsigned char *b = f.buf + off;
        unsigned rtype = b[0];
        Py_ssize_t start = off, end = off + 3 + u16(b + 1);
        if (end > n) {
            if (PyList_Append(errors, str_truncated) < 0) {
                goto fail;
            }
            break;
        }
        off = end;
        f.n_strings = PyList_GET_SIZE(f.strings); /* the fallback may not change it, but read it fresh */
        PyObject *rec = NULL;
        if (rtype == EV_RECORD) {
            rec = read_record(&f, start, end);
        } else if (rtype == EV_REQUEST) {
            rec = read_request(&f, start, end);
        } else if (rtype == EV_HTTP) {
            rec = read_http(&f, start, end);
        }
        if (rec != NULL) {
            int rc = PyList_Append(records, rec);
            Py_DECREF(rec);
            if (rc < 0) {
                goto fail;
            }
            continue;
        }
        if (PyErr_Occurred()) { /* a rid that is not UTF-8, or memory: the Python loop decides, as its own fast path would */
            PyErr_Clear();
        }
        if (fall_back(args, start, records, errors) < 0) {
            goto fail;
        }
        if (rtype != EV_RECORD && rtype != EV_REQUEST && rtype != EV_HTTP) {
            f.last_sid = -1; /* a SCHEMA record may have replaced the cached schema */
            Py_CLEAR(f.schema);
        }
    }
    frame_clear(&f);
    PyObject *out = PyTuple_Pack(2, records, errors);
    Py_DECREF(records);
    Py_DECREF(errors);
    return out;
fail:
    frame_clear(&f);
    Py_XDECREF(records);
    Py_XDECREF(errors);
    return NULL;
}

PyDoc_STRVAR(configure_doc,
"configure(loop)\n\n"
"Set the generated Python loop that reads every record this module does not.");

static PyObject *configure_fn(PyObject *module, PyObject *loop) {
    if (!PyCallable_Check(loop)) {
        PyErr_SetString(PyExc_TypeError, "configure() takes the generated loop, a callable");
        return NULL;
    }
    Py_INCREF(loop);
    Py_XSETREF(fallback_loop, loop);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"records", (PyCFunction)(void (*)(void))records_fn, METH_FASTCALL, records_doc},
    {"configure", configure_fn, METH_O, configure_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wirec",
    "The sidecar's compiled loop over a wire frame's records (see _wirec.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__wirec(void) {
    str_truncated = PyUnicode_InternFromString("truncated");
    str_schemas = PyUnicode_InternFromString("_schemas");
    if (str_truncated == NULL || str_schemas == NULL) {
        return NULL;
    }
    PyObject *mod = PyImport_ImportModule("struct");
    if (mod == NULL) {
        return NULL;
    }
    struct_type = PyObject_GetAttrString(mod, "Struct");
    Py_DECREF(mod);
    if (struct_type == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
