/* nbdist._kernels: the hub's memory-bound per-push passes over float32 buffers, in C.
 *
 * Why: at 10M+ parameters a push is bound by memory traffic. NumPy's fused pass reads g and w,
 * writes w and writes the reply with ordinary stores (each store first reads its cache line:
 * read-for-ownership), about 5 x 4 bytes per float. Here the reply is written with streaming
 * (non-temporal) stores, which skip that read and do not evict the working set: 4 x 4 bytes.
 *
 * Every function gives the bit-identical numbers of nbdist.algorithms.kernels' NumPy path:
 * `s = g * lr` rounded to float32, then `w - s` (built with -ffp-contract=off: no fused
 * multiply-add). Buffers come through the buffer protocol (no NumPy C API, so one build works
 * with any NumPy); the loops run without the GIL so the hub's block pool can run two at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) && !defined(NBDIST_NO_STREAMING)
#include <emmintrin.h>
#define NBDIST_STREAMING 1
#else
#define NBDIST_STREAMING 0
#endif

/* ---- argument checks ------------------------------------------------------------------- */

static int is_float32_format(const char *format)
{
    if (format == NULL)
        return 0; /* unsigned bytes */
    if (format[0] == '<' || format[0] == '=' || format[0] == '@')
        format++;
    return format[0] == 'f' && format[1] == '\0';
}

/* Fill `view` with a C-contiguous float32 buffer of `obj`, or set a clear error. */
static int get_floats(PyObject *obj, Py_buffer *view, const char *name, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_TypeError,
                     "nbdist._kernels: %s must be a %sC-contiguous float32 buffer (a NumPy "
                     "float32 array or a contiguous slice of one). Received: %.100s (%S). "
                     "Pass np.ascontiguousarray(%s, dtype=np.float32)%s.",
                     name, writable ? "writable " : "", Py_TYPE(obj)->tp_name,
                     value ? value : Py_None, name,
                     writable ? " (writable: not a read-only view or bytes)" : "");
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    if (!is_float32_format(view->format) || view->itemsize != 4) {
        PyErr_Format(PyExc_TypeError,
                     "nbdist._kernels: %s must hold float32 values. Received: format '%s', "
                     "itemsize %zd. Convert it with %s.astype(np.float32) (the hub keeps every "
                     "parameter and gradient in float32).",
                     name, view->format ? view->format : "B", view->itemsize, name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int same_length(const Py_buffer *a, const char *a_name, const Py_buffer *b,
                       const char *b_name)
{
    if (a->len == b->len)
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "nbdist._kernels: %s and %s must have the same number of floats. Received: "
                 "%zd and %zd. Pass slices of the same range [lo, hi) of each.",
                 a_name, b_name, a->len / 4, b->len / 4);
    return -1;
}

static int apart(const Py_buffer *a, const char *a_name, const Py_buffer *b, const char *b_name)
{
    const char *a0 = (const char *)a->buf, *b0 = (const char *)b->buf;
    if (a->len == 0 || b->len == 0 || a0 + a->len <= b0 || b0 + b->len <= a0)
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "nbdist._kernels: %s and %s overlap in memory. Expected separate buffers "
                 "(the result would depend on the order of the loop). Pass a copy of one.",
                 a_name, b_name);
    return -1;
}

static int lr_as_float(PyObject *obj, float *lr)
{
    double value = PyFloat_AsDouble(obj);
    if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "nbdist._kernels: lr must be a real number. Received: %.100s. Pass "
                     "float(lr).",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *lr = (float)value; /* rounds to nearest, as np.float32(lr) */
    return 0;
}

/* ---- the loops ------------------------------------------------------------------------- */

static void step(float *w, const float *g, float lr, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float s = g[i] * lr;
        w[i] = w[i] - s;
    }
}

static void step_copy(float *w, const float *g, float lr, float *out, Py_ssize_t n, int stream)
{
    Py_ssize_t i = 0;
#if NBDIST_STREAMING
    for (; stream && i < n && ((uintptr_t)(out + i) & 15) != 0; i++) { /* head: out to 16 bytes */
        float s = g[i] * lr;
        float v = w[i] - s;
        w[i] = v;
        out[i] = v;
    }
    if (stream && ((uintptr_t)(out + i) & 15) == 0) {
        const __m128 vlr = _mm_set1_ps(lr);
        for (; i + 16 <= n; i += 16) { /* one 64-byte line of out per iteration */
            __m128 w0 = _mm_sub_ps(_mm_loadu_ps(w + i), _mm_mul_ps(_mm_loadu_ps(g + i), vlr));
            __m128 w1 = _mm_sub_ps(_mm_loadu_ps(w + i + 4), _mm_mul_ps(_mm_loadu_ps(g + i + 4), vlr));
            __m128 w2 = _mm_sub_ps(_mm_loadu_ps(w + i + 8), _mm_mul_ps(_mm_loadu_ps(g + i + 8), vlr));
            __m128 w3 = _mm_sub_ps(_mm_loadu_ps(w + i + 12), _mm_mul_ps(_mm_loadu_ps(g + i + 12), vlr));
            _mm_storeu_ps(w + i, w0);
            _mm_storeu_ps(w + i + 4, w1);
            _mm_storeu_ps(w + i + 8, w2);
            _mm_storeu_ps(w + i + 12, w3);
            _mm_stream_ps(out + i, w0);
            _mm_stream_ps(out + i + 4, w1);
            _mm_stream_ps(out + i + 8, w2);
            _mm_stream_ps(out + i + 12, w3);
        }
        _mm_sfence(); /* the streamed reply is visible before the socket send reads it */
    }
#endif
    for (; i < n; i++) {
        float s = g[i] * lr;
        float v = w[i] - s;
        w[i] = v;
        out[i] = v;
    }
}

static void copy_stream(float *dst, const float *src, Py_ssize_t n)
{
    Py_ssize_t i = 0;
#if NBDIST_STREAMING
    for (; i < n && ((uintptr_t)(dst + i) & 15) != 0; i++)
        dst[i] = src[i];
    if (((uintptr_t)(dst + i) & 15) == 0) {
        for (; i + 16 <= n; i += 16) {
            __m128 a = _mm_loadu_ps(src + i), b = _mm_loadu_ps(src + i + 4);
            __m128 c = _mm_loadu_ps(src + i + 8), d = _mm_loadu_ps(src + i + 12);
            _mm_stream_ps(dst + i, a);
            _mm_stream_ps(dst + i + 4, b);
            _mm_stream_ps(dst + i + 8, c);
            _mm_stream_ps(dst + i + 12, d);
        }
        _mm_sfence();
    }
#endif
    if (i < n)
        memcpy(dst + i, src + i, (size_t)(n - i) * sizeof(float));
}

/* ---- the Python functions -------------------------------------------------------------- */

PyDoc_STRVAR(sgd_step_doc,
"sgd_step(w, g, lr)\n--\n\n"
"w -= float32(lr) * g in place, in one pass (float32, C-contiguous, same length).");

static PyObject *py_sgd_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer w, g;
    float lr;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "sgd_step(w, g, lr) takes 3 arguments. Received: %zd.",
                     nargs);
        return NULL;
    }
    if (lr_as_float(args[2], &lr) != 0 || get_floats(args[0], &w, "w", 1) != 0)
        return NULL;
    if (get_floats(args[1], &g, "g", 0) != 0) {
        PyBuffer_Release(&w);
        return NULL;
    }
    PyObject *result = NULL;
    if (same_length(&w, "w", &g, "g") == 0 && (w.buf == g.buf || apart(&w, "w", &g, "g") == 0)) {
        Py_BEGIN_ALLOW_THREADS
        step((float *)w.buf, (const float *)g.buf, lr, w.len / 4);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&g);
    PyBuffer_Release(&w);
    return result;
}

PyDoc_STRVAR(sgd_step_copy_doc,
"sgd_step_copy(w, g, lr, out, stream=True)\n--\n\n"
"w -= float32(lr) * g; out[:] = w, in one pass. stream: write out with streaming stores\n"
"(for a reply larger than the cache; a small one is read again sooner from the cache).");

static PyObject *py_sgd_step_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer w, g, out;
    float lr;
    int stream = 1;
    if (nargs != 4 && nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "sgd_step_copy(w, g, lr, out, stream=True) takes 4 or 5 positional "
                     "arguments. Received: %zd.", nargs);
        return NULL;
    }
    if (nargs == 5 && (stream = PyObject_IsTrue(args[4])) < 0)
        return NULL;
    if (lr_as_float(args[2], &lr) != 0 || get_floats(args[0], &w, "w", 1) != 0)
        return NULL;
    if (get_floats(args[1], &g, "g", 0) != 0) {
        PyBuffer_Release(&w);
        return NULL;
    }
    if (get_floats(args[3], &out, "out", 1) != 0) {
        PyBuffer_Release(&g);
        PyBuffer_Release(&w);
        return NULL;
    }
    PyObject *result = NULL;
    if (same_length(&w, "w", &g, "g") == 0 && same_length(&w, "w", &out, "out") == 0
        && (w.buf == g.buf || apart(&w, "w", &g, "g") == 0)
        && apart(&out, "out", &w, "w") == 0 && apart(&out, "out", &g, "g") == 0) {
        Py_BEGIN_ALLOW_THREADS
        step_copy((float *)w.buf, (const float *)g.buf, lr, (float *)out.buf, w.len / 4, stream);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&g);
    PyBuffer_Release(&w);
    return result;
}

PyDoc_STRVAR(copy_stream_doc,
"copy_stream(dst, src)\n--\n\n"
"dst[:] = src with streaming stores (float32, C-contiguous, same length, apart).");

static PyObject *py_copy_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer dst, src;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "copy_stream(dst, src) takes 2 arguments. Received: %zd.",
                     nargs);
        return NULL;
    }
    if (get_floats(args[0], &dst, "dst", 1) != 0)
        return NULL;
    if (get_floats(args[1], &src, "src", 0) != 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *result = NULL;
    if (same_length(&dst, "dst", &src, "src") == 0 && apart(&dst, "dst", &src, "src") == 0) {
        Py_BEGIN_ALLOW_THREADS
        copy_stream((float *)dst.buf, (const float *)src.buf, dst.len / 4);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"sgd_step", (PyCFunction)(void (*)(void))py_sgd_step, METH_FASTCALL, sgd_step_doc},
    {"sgd_step_copy", (PyCFunction)(void (*)(void))py_sgd_step_copy, METH_FASTCALL,
     sgd_step_copy_doc},
    {"copy_stream", (PyCFunction)(void (*)(void))py_copy_stream, METH_FASTCALL, copy_stream_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "nbdist._kernels",
    "The hub's memory-bound float32 passes in C (see nbdist.algorithms.kernels).",
    -1,
    methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "STREAMING", NBDIST_STREAMING) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
