/* The canary component's pass over a staged batch (issue 23, item 8), in C: what
 * ``CanaryComponent._gather`` does in Python for the common events, with the same dictionaries.
 *
 * gather(batch, reqs, streams, recs, limit, overflow, fallback, ev_request, n_outcomes) -> int
 *
 *   reqs: ctx -> (outcomes, e2e seconds, {stage label: seconds}, {raw stage name: that list})
 *   streams: ctx -> (times to first token, inter-token gaps (seconds), [0])
 *   recs: ctx -> (confidences, predictions)
 *
 * It reads a REQUEST whose outcome is an int in range, whose duration is an int or a float that is not NaN
 * and whose stages are (str, int or float, stream) tuples, a stream None or (ttft, items, gaps[, undelivered])
 * with an int or float ttft, an int item count and a tuple of int gaps (microseconds), and any other event's
 * prediction (a str or None)
 * and confidence (a float or None). Every other event (a streamed stage, a prediction that needs ``canon``,
 * an int confidence, a tuple too short, an unhashable ctx...) goes, whole and in its turn, to ``fallback``,
 * the Python reading of one event, so the lists, the label limiter's calls and the first-seen orders are the
 * Python loop's (tests/components/canary/test_gatherc.py). Events are checked before anything is appended;
 * the one thing that can fail after that is the limiter's call, and then the event is counted as the
 * Python loop counts it: the returned int is the number of such errors.
 *
 * It raises (returns NULL) only for a bad call (wrong argument types), no memory, or a fallback that raises.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

/* A new value for reqs: (outcomes, e2e seconds, stage lists by label, the same lists by raw name): two empty
 * lists and two empty dicts. */
static PyObject *new_req_entry(void) {
    PyObject *a = PyList_New(0), *b = PyList_New(0), *c = PyDict_New(), *d = PyDict_New();
    if (a == NULL || b == NULL || c == NULL || d == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        Py_XDECREF(d);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(4, a, b, c, d);
    Py_DECREF(a);
    Py_DECREF(b);
    Py_DECREF(c);
    Py_DECREF(d);
    return t;
}

static PyObject *new_rec_entry(void) {
    PyObject *a = PyList_New(0), *b = PyList_New(0);
    if (a == NULL || b == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, a, b);
    Py_DECREF(a);
    Py_DECREF(b);
    return t;
}

/* The entry of ``ctx`` in ``d`` (borrowed), made by ``make`` when missing; NULL (no exception set): the ctx
 * cannot be a key, or no memory; the event then goes to the fallback, which raises what Python raises. */
static PyObject *entry(PyObject *d, PyObject *ctx, PyObject *(*make)(void)) {
    PyObject *e = PyDict_GetItemWithError(d, ctx);
    if (e != NULL) {
        return e;
    }
    if (!PyErr_Occurred() && (e = make()) != NULL) {
        int rc = PyDict_SetItem(d, ctx, e);
        Py_DECREF(e);
        if (rc == 0) {
            return e;
        }
    }
    PyErr_Clear();
    return NULL;
}

static int as_seconds(PyObject *v, double *out) {
    double x;
    if (PyLong_CheckExact(v)) {
        x = PyLong_AsDouble(v);
        if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else if (PyFloat_CheckExact(v)) {
        x = PyFloat_AS_DOUBLE(v);
    } else {
        return 0;
    }
    *out = x * 1e-9;
    return 1;
}

/* Whether a stage's stream is one this loop reads: (ttft, items, gaps) or (ttft, items, gaps, undelivered). */
static int plain_stream(PyObject *st) {
    double t;
    if (!PyTuple_CheckExact(st) || PyTuple_GET_SIZE(st) < 3 || PyTuple_GET_SIZE(st) > 4
            || !as_seconds(PyTuple_GET_ITEM(st, 0), &t) || !PyLong_CheckExact(PyTuple_GET_ITEM(st, 1))
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(st, 2))) {
        return 0;
    }
    PyObject *gaps = PyTuple_GET_ITEM(st, 2);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(gaps); i++) {
        PyObject *g = PyTuple_GET_ITEM(gaps, i);
        if (!PyLong_CheckExact(g)) {
            return 0;
        }
        double x = PyLong_AsDouble(g);
        if (x == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Whether a REQUEST event is one this loop reads: outcome, duration and every stage checked first. */
static int plain_request(PyObject *ev, long n_outcomes) {
    if (PyTuple_GET_SIZE(ev) < 9) {
        return 0;
    }
    PyObject *outcome = PyTuple_GET_ITEM(ev, 4);
    if (!PyLong_CheckExact(outcome)) {
        return 0;
    }
    long o = PyLong_AsLong(outcome);
    if (o == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    double e2e;
    if (o < 0 || o >= n_outcomes || !as_seconds(PyTuple_GET_ITEM(ev, 3), &e2e) || isnan(e2e)) {
        return 0;
    }
    PyObject *stages = PyTuple_GET_ITEM(ev, 8);
    if (!PyTuple_CheckExact(stages) && !PyList_CheckExact(stages)) {
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(stages);
    PyObject **items = PySequence_Fast_ITEMS(stages);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = items[i];
        double d = 0.0;
        if (!PyTuple_CheckExact(s) || PyTuple_GET_SIZE(s) != 3 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(s, 0))
                || !as_seconds(PyTuple_GET_ITEM(s, 1), &d)
                || (PyTuple_GET_ITEM(s, 2) != Py_None && !plain_stream(PyTuple_GET_ITEM(s, 2)))) {
            return 0;
        }
    }
    return 1;
}

static int append_float(PyObject *list, double v) {
    PyObject *f = PyFloat_FromDouble(v);
    if (f == NULL) {
        return -1;
    }
    int rc = PyList_Append(list, f);
    Py_DECREF(f);
    return rc;
}

static PyObject *new_stream_entry(void) {
    PyObject *a = PyList_New(0), *b = PyList_New(0), *zero = PyLong_FromLong(0);
    PyObject *c = zero == NULL ? NULL : PyList_New(1);
    if (a == NULL || b == NULL || c == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(zero);
        return NULL;
    }
    PyList_SET_ITEM(c, 0, zero);
    PyObject *t = PyTuple_Pack(3, a, b, c);
    Py_DECREF(a);
    Py_DECREF(b);
    Py_DECREF(c);
    return t;
}

/* A checked stream into ``streams[ctx]``: its TTFT when it delivered items, its gaps in seconds. -1: no memory. */
static int add_stream(PyObject *streams, PyObject *ctx, PyObject *stream) {
    PyObject *e = entry(streams, ctx, new_stream_entry); /* the ctx was a key of reqs already */
    if (e == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    double ttft = 0.0;
    as_seconds(PyTuple_GET_ITEM(stream, 0), &ttft);
    if (PyObject_IsTrue(PyTuple_GET_ITEM(stream, 1)) && append_float(PyTuple_GET_ITEM(e, 0), ttft) < 0) {
        return -1;
    }
    PyObject *gaps = PyTuple_GET_ITEM(stream, 2), *out = PyTuple_GET_ITEM(e, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(gaps); i++) {
        if (append_float(out, PyLong_AsDouble(PyTuple_GET_ITEM(gaps, i)) * 1e-6) < 0) {
            return -1;
        }
    }
    return 0;
}

typedef struct {
    PyObject *streams;
    PyObject *limit, *overflow;
    PyObject *last_ctx; /* borrowed; identity only */
    PyObject *entry;    /* borrowed from reqs */
    long errors;
} ReqState;

/* Add a checked REQUEST: 0 done, 1 the limiter failed (counted, as the Python loop counts it), -1 no memory. */
static int add_request(ReqState *st, PyObject *r, PyObject *ev) {
    PyObject *outcomes = PyTuple_GET_ITEM(r, 0), *e2e = PyTuple_GET_ITEM(r, 1);
    PyObject *by_label = PyTuple_GET_ITEM(r, 2), *by_name = PyTuple_GET_ITEM(r, 3);
    double v = 0.0;
    as_seconds(PyTuple_GET_ITEM(ev, 3), &v);
    if (PyList_Append(outcomes, PyTuple_GET_ITEM(ev, 4)) < 0 || append_float(e2e, v) < 0) {
        return -1;
    }
    PyObject *stages = PyTuple_GET_ITEM(ev, 8);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(stages);
    PyObject **items = PySequence_Fast_ITEMS(stages);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(items[i], 0);
        PyObject *vals = PyDict_GetItemWithError(by_name, name); /* borrowed */
        if (vals == NULL) {
            if (PyErr_Occurred()) {
                return -1;
            }
            PyObject *label = PyObject_CallOneArg(st->limit, name);
            if (label == NULL) {
                PyErr_Clear();
                return 1;
            }
            PyObject *fresh = PyList_New(0);
            if (fresh == NULL) {
                Py_DECREF(label);
                return -1;
            }
            vals = PyDict_SetDefault(by_label, label, fresh); /* borrowed */
            Py_DECREF(fresh);
            if (vals == NULL) {
                Py_DECREF(label);
                PyErr_Clear();
                return 1; /* an unhashable label: the Python loop's setdefault raises too */
            }
            int ne = PyObject_RichCompareBool(label, st->overflow, Py_NE);
            Py_DECREF(label);
            if (ne < 0) {
                PyErr_Clear();
                return 1;
            }
            if (ne && PyDict_SetItem(by_name, name, vals) < 0) {
                return -1;
            }
        }
        double d = 0.0;
        as_seconds(PyTuple_GET_ITEM(items[i], 1), &d);
        if (append_float(vals, d) < 0) {
            return -1;
        }
        PyObject *stream = PyTuple_GET_ITEM(items[i], 2);
        if (stream != Py_None && add_stream(st->streams, PyTuple_GET_ITEM(ev, 1), stream) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A record's prediction (str or None) and confidence (float or None); 0: the fallback reads it. */
static int plain_record(PyObject *ev) {
    if (PyTuple_GET_SIZE(ev) < 6) {
        return 0;
    }
    PyObject *pred = PyTuple_GET_ITEM(ev, 4), *conf = PyTuple_GET_ITEM(ev, 5);
    return (pred == Py_None || PyUnicode_CheckExact(pred)) && (conf == Py_None || PyFloat_CheckExact(conf));
}

static int add_record(PyObject *c, PyObject *ev) {
    PyObject *pred = PyTuple_GET_ITEM(ev, 4), *conf = PyTuple_GET_ITEM(ev, 5);
    if (conf != Py_None && isfinite(PyFloat_AS_DOUBLE(conf)) && PyList_Append(PyTuple_GET_ITEM(c, 0), conf) < 0) {
        return -1;
    }
    if (pred != Py_None && PyList_Append(PyTuple_GET_ITEM(c, 1), pred) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_Check(args[0]) || !PyDict_CheckExact(args[1]) || !PyDict_CheckExact(args[2])
            || !PyDict_CheckExact(args[3]) || !PyLong_CheckExact(args[7]) || !PyLong_CheckExact(args[8])) {
        PyErr_SetString(PyExc_TypeError, "gather(batch: list, reqs: dict, streams: dict, recs: dict, limit, overflow, "
                                         "fallback, ev_request: int, n_outcomes: int)");
        return NULL;
    }
    long ev_request = PyLong_AsLong(args[7]), n_outcomes = PyLong_AsLong(args[8]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *batch = args[0], *reqs = args[1], *recs = args[3], *fallback = args[6];
    ReqState st = {args[2], args[4], args[5], NULL, NULL, 0};
    PyObject *last_rec = NULL, *c = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        PyObject *ev = PyList_GET_ITEM(batch, i);
        int done = 0;
        if (PyTuple_CheckExact(ev) && PyTuple_GET_SIZE(ev) >= 2 && PyLong_CheckExact(PyTuple_GET_ITEM(ev, 0))) {
            PyObject *ctx = PyTuple_GET_ITEM(ev, 1);
            if (PyLong_AsLong(PyTuple_GET_ITEM(ev, 0)) == ev_request) {
                if (plain_request(ev, n_outcomes)) {
                    if (ctx != st.last_ctx) {
                        st.entry = entry(reqs, ctx, new_req_entry);
                        st.last_ctx = st.entry == NULL ? NULL : ctx;
                    }
                    if (st.entry != NULL) {
                        int rc = add_request(&st, st.entry, ev);
                        if (rc < 0) {
                            return NULL;
                        }
                        st.errors += rc;
                        done = 1;
                    }
                }
            } else if (PyErr_Occurred()) {
                PyErr_Clear(); /* a type code too large for a C long: the fallback says what it is */
            } else if (plain_record(ev)) {
                if (PyTuple_GET_ITEM(ev, 4) == Py_None && PyTuple_GET_ITEM(ev, 5) == Py_None) {
                    done = 1;
                } else {
                    if (ctx != last_rec) {
                        c = entry(recs, ctx, new_rec_entry);
                        last_rec = c == NULL ? NULL : ctx;
                    }
                    if (c != NULL) {
                        if (add_record(c, ev) < 0) {
                            return NULL;
                        }
                        done = 1;
                    }
                }
            }
        }
        if (PyErr_Occurred()) {
            return NULL; /* defensive: every path above clears what it does not return */
        }
        if (!done) {
            PyObject *got = PyObject_CallOneArg(fallback, ev);
            if (got == NULL) {
                return NULL;
            }
            Py_DECREF(got);
        }
    }
    return PyLong_FromLong(st.errors);
}

static PyMethodDef methods[] = {
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL,
     "gather(batch, reqs, streams, recs, limit, overflow, fallback, ev_request, n_outcomes) -> errors: the canary's "
     "pass over a batch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gatherc",
    "The canary component's compiled pass over a staged batch (see _gatherc.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__gatherc(void) {
    return PyModule_Create(&module);
}
