/* nbdist._kernels: the hub's memory-bound per-push passes over float32 buffers, in C.
 *
 * Why: at 10M+ parameters a push is bound by memory traffic. NumPy's fused SGD pass reads g
 * and w, writes w and writes the reply with ordinary stores (each store first reads its cache
 * line: read-for-ownership), about 5 x 4 bytes per float. Here the reply is written with
 * streaming (non-temporal) stores, which skip that read and do not evict the working set:
 * 4 x 4 bytes. Adam's and momentum's formulas run as one loop instead of NumPy's 6-12 passes.
 *
 * Every function gives the numbers of nbdist.algorithms.kernels' NumPy path bit for bit
 * (tests/unit/test_kernels.py): each operation rounded to float32 in NumPy's order, built with
 * -ffp-contract=off (no fused multiply-add). The one freedom left is IEEE 754's: where two
 * NaNs meet in a commutative operation of a formula, which NaN comes out. Buffers come through
 * the buffer protocol (no NumPy C API, so one build works with any NumPy); the loops run
 * without the GIL so the hub's block pool can run two at once. -DNBDIST_NO_STREAMING builds
 * it with ordinary stores only (to measure what streaming gives).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
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

static int lr_as_float(PyObject *obj, const char *name, float *value)
{
    double x = PyFloat_AsDouble(obj);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "nbdist._kernels: %s must be a real number. Received: %.100s. Pass "
                     "float(%s).",
                     name, Py_TYPE(obj)->tp_name, name);
        return -1;
    }
    *value = (float)x; /* rounds to nearest, as np.float32(x) */
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

/* ---- the optimizers' formulas (nbdist/algorithms/optimizer_rules.py, the same operations in
 * the same order, each rounded to float32) ----------------------------------------------- */

static void adam(float *restrict w, const float *restrict g, float *restrict m,
                 float *restrict v, float alpha, float one_minus_beta_1, float one_minus_beta_2,
                 float epsilon, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = m[i] + (gi - m[i]) * one_minus_beta_1;  /* _ema_into */
        float vi = v[i] + (gi * gi - v[i]) * one_minus_beta_2;
        m[i] = mi;
        v[i] = vi;
        w[i] = w[i] - (mi * alpha) / (sqrtf(vi) + epsilon);
    }
}

static void momentum(float *restrict w, const float *restrict g, float *restrict m, float lr,
                     float mu, int nesterov, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        float a = g[i] * lr;
        float mi = m[i] * mu - a;
        m[i] = mi;
        w[i] = w[i] + (nesterov ? mi * mu - a : mi);
    }
}

/* ---- the Python functions -------------------------------------------------------------- */

typedef struct {
    const char *name;
    int writable;
} Arg;

static void release(Py_buffer *views, int count)
{
    for (int i = 0; i < count; i++)
        PyBuffer_Release(&views[i]);
}

/* The `count` float32 buffers of `objs`, checked: float32, C-contiguous, writable as `args`
 * says, the same length, no two overlapping (but the first two may be the same buffer when
 * `same_01`: `w -= lr * w` is still elementwise). */
static int get_arrays(PyObject *const *objs, const Arg *args, int count, int same_01,
                      Py_buffer *views)
{
    for (int i = 0; i < count; i++) {
        if (get_floats(objs[i], &views[i], args[i].name, args[i].writable) != 0) {
            release(views, i);
            return -1;
        }
    }
    for (int i = 1; i < count; i++) {
        if (same_length(&views[0], args[0].name, &views[i], args[i].name) != 0)
            goto refused;
    }
    for (int i = 0; i < count; i++) {
        for (int j = i + 1; j < count; j++) {
            if (same_01 && i == 0 && j == 1 && views[0].buf == views[1].buf)
                continue;
            if (apart(&views[i], args[i].name, &views[j], args[j].name) != 0)
                goto refused;
        }
    }
    return 0;
refused:
    release(views, count);
    return -1;
}

static int floats(PyObject *const *objs, const char *const *names, int count, float *values)
{
    for (int i = 0; i < count; i++) {
        if (lr_as_float(objs[i], names[i], &values[i]) != 0)
            return -1;
    }
    return 0;
}

static int arity(const char *signature, Py_ssize_t nargs, Py_ssize_t least, Py_ssize_t most)
{
    if (nargs >= least && nargs <= most)
        return 0;
    if (most > least)
        PyErr_Format(PyExc_TypeError, "nbdist._kernels.%s takes %zd or %zd positional "
                     "arguments. Received: %zd.", signature, least, most, nargs);
    else
        PyErr_Format(PyExc_TypeError, "nbdist._kernels.%s takes %zd positional arguments. "
                     "Received: %zd.", signature, least, nargs);
    return -1;
}

#define WITHOUT_GIL(call) do { Py_BEGIN_ALLOW_THREADS call; Py_END_ALLOW_THREADS } while (0)

PyDoc_STRVAR(sgd_step_doc,
"sgd_step(w, g, lr)\n--\n\n"
"w -= float32(lr) * g in place, in one pass (float32, C-contiguous, same length).");

static PyObject *py_sgd_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Arg spec[] = {{"w", 1}, {"g", 0}};
    static const char *const names[] = {"lr"};
    Py_buffer v[2];
    float lr;
    if (arity("sgd_step(w, g, lr)", nargs, 3, 3) != 0 || floats(args + 2, names, 1, &lr) != 0
        || get_arrays(args, spec, 2, 1, v) != 0)
        return NULL;
    WITHOUT_GIL(step(v[0].buf, v[1].buf, lr, v[0].len / 4));
    release(v, 2);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(sgd_step_copy_doc,
"sgd_step_copy(w, g, lr, out, stream=True)\n--\n\n"
"w -= float32(lr) * g; out[:] = w, in one pass. stream: write out with streaming stores\n"
"(for a reply larger than the cache; a small one is read again sooner from the cache).");

static PyObject *py_sgd_step_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Arg spec[] = {{"w", 1}, {"g", 0}, {"out", 1}};
    static const char *const names[] = {"lr"};
    PyObject *objs[3];
    Py_buffer v[3];
    float lr;
    int stream = 1;
    if (arity("sgd_step_copy(w, g, lr, out, stream=True)", nargs, 4, 5) != 0
        || floats(args + 2, names, 1, &lr) != 0
        || (nargs == 5 && (stream = PyObject_IsTrue(args[4])) < 0))
        return NULL;
    objs[0] = args[0], objs[1] = args[1], objs[2] = args[3];
    if (get_arrays(objs, spec, 3, 1, v) != 0)
        return NULL;
    WITHOUT_GIL(step_copy(v[0].buf, v[1].buf, lr, v[2].buf, v[0].len / 4, stream));
    release(v, 3);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(copy_stream_doc,
"copy_stream(dst, src)\n--\n\n"
"dst[:] = src with streaming stores (float32, C-contiguous, same length, apart).");

static PyObject *py_copy_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Arg spec[] = {{"dst", 1}, {"src", 0}};
    Py_buffer v[2];
    if (arity("copy_stream(dst, src)", nargs, 2, 2) != 0 || get_arrays(args, spec, 2, 0, v) != 0)
        return NULL;
    WITHOUT_GIL(copy_stream(v[0].buf, v[1].buf, v[0].len / 4));
    release(v, 2);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(adam_step_doc,
"adam_step(w, g, m, v, alpha, one_minus_beta_1, one_minus_beta_2, epsilon)\n--\n\n"
"Keras's Adam step (no AMSGrad) in one pass, as optimizer_rules.AdamFormula: m and v move,\n"
"then w -= m * alpha / (sqrt(v) + epsilon); every scalar is rounded to float32 first.");

static PyObject *py_adam_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Arg spec[] = {{"w", 1}, {"g", 0}, {"m", 1}, {"v", 1}};
    static const char *const names[] = {"alpha", "one_minus_beta_1", "one_minus_beta_2",
                                        "epsilon"};
    Py_buffer b[4];
    float x[4];
    if (arity("adam_step(w, g, m, v, alpha, one_minus_beta_1, one_minus_beta_2, epsilon)",
              nargs, 8, 8) != 0
        || floats(args + 4, names, 4, x) != 0 || get_arrays(args, spec, 4, 0, b) != 0)
        return NULL;
    WITHOUT_GIL(adam(b[0].buf, b[1].buf, b[2].buf, b[3].buf, x[0], x[1], x[2], x[3],
                     b[0].len / 4));
    release(b, 4);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(momentum_step_doc,
"momentum_step(w, g, m, lr, momentum, nesterov)\n--\n\n"
"Keras's SGD with momentum in one pass, as optimizer_rules.SGDFormula: m = m*mu - lr*g;\n"
"w += m (nesterov: w += m*mu - lr*g); lr and momentum are rounded to float32 first.");

static PyObject *py_momentum_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const Arg spec[] = {{"w", 1}, {"g", 0}, {"m", 1}};
    static const char *const names[] = {"lr", "momentum"};
    Py_buffer b[3];
    float x[2];
    int nesterov;
    if (arity("momentum_step(w, g, m, lr, momentum, nesterov)", nargs, 6, 6) != 0
        || floats(args + 3, names, 2, x) != 0 || (nesterov = PyObject_IsTrue(args[5])) < 0
        || get_arrays(args, spec, 3, 0, b) != 0)
        return NULL;
    WITHOUT_GIL(momentum(b[0].buf, b[1].buf, b[2].buf, x[0], x[1], nesterov, b[0].len / 4));
    release(b, 3);
    Py_RETURN_NONE;
}

#define METHOD(name) {#name, (PyCFunction)(void (*)(void))py_##name, METH_FASTCALL, name##_doc}

static PyMethodDef methods[] = {
    METHOD(sgd_step), METHOD(sgd_step_copy), METHOD(copy_stream), METHOD(adam_step),
    METHOD(momentum_step), {NULL, NULL, 0, NULL},
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
