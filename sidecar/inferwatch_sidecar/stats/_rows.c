/*
 * Rows of floats into a matrix, in C (issue 23, item 8).
 *
 * The drift windows read a batch's numeric features, one tuple of floats per record as the wire decoder
 * makes them, into a float64 matrix. numpy's fromiter over the chained tuples costs about half a
 * microsecond a 20-feature record, a quarter of drift's work per event; this loop reads each float's value
 * directly. It takes only exact tuples of exact floats; anything else returns False and the caller reads the
 * rows its own way (tests/stats/test_rows.py holds both to the same matrix).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyDoc_STRVAR(stack_floats_doc,
"stack_floats(rows, width, out) -> bool\n\n"
"Write ``rows`` (a list of tuples of ``width`` floats) into ``out``, a writable C-contiguous buffer of\n"
"len(rows) * width doubles. False, with ``out`` partly written, when a row is not a tuple of ``width``\n"
"floats (the caller then reads them another way).");

static PyObject *stack_floats(PyObject *module, PyObject *args) {
    PyObject *rows;
    Py_ssize_t width;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "O!nw*", &PyList_Type, &rows, &width, &out)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    if (width < 0 || out.len != n * width * (Py_ssize_t)sizeof(double) || !PyBuffer_IsContiguous(&out, 'C')) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "stack_floats: out must hold len(rows) * width doubles, C-contiguous");
        return NULL;
    }
    double *d = (double *)out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != width) {
            PyBuffer_Release(&out);
            Py_RETURN_FALSE;
        }
        for (Py_ssize_t j = 0; j < width; j++) {
            PyObject *v = PyTuple_GET_ITEM(row, j);
            if (!PyFloat_CheckExact(v)) {
                PyBuffer_Release(&out);
                Py_RETURN_FALSE;
            }
            d[i * width + j] = PyFloat_AS_DOUBLE(v);
        }
    }
    PyBuffer_Release(&out);
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"stack_floats", stack_floats, METH_VARARGS, stack_floats_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows", "Rows of floats into a matrix, in C (see _rows.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
