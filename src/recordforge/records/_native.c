/* recordforge._native: TFRecord framing and CRC32C, finding and checking framed records, in
 * loops over whole batches (no Python call per record; the GIL is released), and the module
 * itself; the encoder of Examples is _examples.c, the decoder _decode.c.
 */
#include "_native.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define RF_X86_CRC 1
#endif

/* ---- CRC32C (Castagnoli), as google-crc32c and TFRecord framing compute it ---- */

static uint32_t crc_table[8][256];
static int have_hw_crc = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#ifdef RF_X86_CRC
    __builtin_cpu_init();
    have_hw_crc = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

static uint32_t crc32c_sw(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) { /* slicing by 8 */
        uint64_t v = load_le64(p) ^ c;
        c = crc_table[7][v & 0xFF] ^ crc_table[6][(v >> 8) & 0xFF] ^ crc_table[5][(v >> 16) & 0xFF] ^
            crc_table[4][(v >> 24) & 0xFF] ^ crc_table[3][(v >> 32) & 0xFF] ^
            crc_table[2][(v >> 40) & 0xFF] ^ crc_table[1][(v >> 48) & 0xFF] ^ crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

#ifdef RF_X86_CRC
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#endif

static inline uint32_t crc32c(const uint8_t *p, size_t n) {
#ifdef RF_X86_CRC
    if (have_hw_crc) return crc32c_hw(p, n);
#endif
    return crc32c_sw(p, n);
}

/* Copies n bytes from src to dst and returns their CRC32C: one pass, each word CRC'd as it is
   stored, where a copy then a CRC would read the record twice. */
#ifdef RF_X86_CRC
__attribute__((target("sse4.2"))) static uint32_t crc32c_copy_hw(uint8_t *dst, const uint8_t *src, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, src, 8);
        memcpy(dst, &v, 8);
        c = _mm_crc32_u64(c, v);
        src += 8;
        dst += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) {
        *dst++ = *src;
        c32 = _mm_crc32_u8(c32, *src++);
    }
    return c32 ^ 0xFFFFFFFFu;
}
#endif

static inline uint32_t crc32c_copy(uint8_t *dst, const uint8_t *src, size_t n) {
#ifdef RF_X86_CRC
    if (have_hw_crc) return crc32c_copy_hw(dst, src, n);
#endif
    memcpy(dst, src, n);
    return crc32c_sw(dst, n);
}

static inline uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

static PyObject *frame_records(PyObject *self, PyObject *args) {
    Py_buffer offs, data;
    if (!PyArg_ParseTuple(args, "y*y*", &offs, &data)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = offs.len / 8 - 1;
    const uint8_t *ob = (const uint8_t *)offs.buf;
    if (n < 0 || offs.len % 8) {
        PyErr_SetString(PyExc_ValueError, "offsets must be n + 1 int64 values");
        goto done;
    }
#define OFF(i) load_i64(ob + 8 * (i))
    for (Py_ssize_t i = 0; i < n; i++) {
        if (OFF(i) < 0 || OFF(i + 1) < OFF(i) || OFF(i + 1) > data.len) {
            PyErr_Format(PyExc_ValueError, "record %zd reaches outside the data", i);
            goto done;
        }
    }
    Py_ssize_t size = n ? (Py_ssize_t)(OFF(n) - OFF(0)) + 16 * n : 0;
    out = PyByteArray_FromStringAndSize(NULL, size);
    if (!out) goto done;
    uint8_t *p = (uint8_t *)PyByteArray_AS_STRING(out);
    const uint8_t *src = (const uint8_t *)data.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = OFF(i);
        uint64_t len = (uint64_t)(OFF(i + 1) - at);
        uint8_t *head = p;
        p = put_le64(p, len);
        p = put_le32(p, masked(crc32c(head, 8)));
        uint32_t crc = crc32c_copy(p, src + at, (size_t)len);
        p += len;
        p = put_le32(p, masked(crc));
    }
    Py_END_ALLOW_THREADS
#undef OFF
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    return out;
}

static inline uint64_t get_le64(const uint8_t *p) { return load_le64(p); }

static inline uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* find_records(data) -> (heads, used, bad): where each whole record at the front of data starts,
   by its length field, as int64 bytes; where the rest begins; bad: whether the record at `used`
   has a length whose CRC does not hold (the hop stops there). */
static PyObject *find_records(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    const uint8_t *buf = (const uint8_t *)data.buf;
    Py_ssize_t n = data.len;
    PyObject *heads = PyByteArray_FromStringAndSize(NULL, (n / 16 + 1) * 8);
    if (!heads) {
        PyBuffer_Release(&data);
        return NULL;
    }
    int64_t *out = (int64_t *)PyByteArray_AS_STRING(heads);
    Py_ssize_t count = 0, pos = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    while (pos + 12 <= n) {
        uint64_t len = get_le64(buf + pos);
        if (len > (uint64_t)(n - pos - 12) || (Py_ssize_t)len + 16 > n - pos) break; /* not all here */
        if (masked(crc32c(buf + pos, 8)) != get_le32(buf + pos + 8)) {
            bad = 1;
            break;
        }
        out[count++] = pos;
        pos += (Py_ssize_t)len + 16;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (PyByteArray_Resize(heads, count * 8) < 0) {
        Py_DECREF(heads);
        return NULL;
    }
    PyObject *result = Py_BuildValue("(Oni)", heads, pos, bad);
    Py_DECREF(heads);
    return result;
}

/* data_crc_mismatches(data, heads, lengths) -> [i, ...]: the records whose data CRC does not hold. */
static PyObject *data_crc_mismatches(PyObject *self, PyObject *args) {
    Py_buffer data, heads, lengths;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &heads, &lengths)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = heads.len / 8;
    const uint8_t *buf = (const uint8_t *)data.buf;
    const uint8_t *hb = (const uint8_t *)heads.buf, *lb = (const uint8_t *)lengths.buf;
    if (lengths.len != heads.len || heads.len % 8) {
        PyErr_SetString(PyExc_ValueError, "heads and lengths must be int64 arrays of one length");
        goto done;
    }
#define H(i) load_i64(hb + 8 * (i))
#define L(i) load_i64(lb + 8 * (i))
    for (Py_ssize_t i = 0; i < n; i++) {
        if (H(i) < 0 || L(i) < 0 || L(i) > data.len || H(i) > data.len - 16 - L(i)) {
            PyErr_Format(PyExc_ValueError, "record %zd reaches outside the data", i);
            goto done;
        }
    }
    result = PyList_New(0);
    if (!result) goto done;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t found = -1;
        Py_BEGIN_ALLOW_THREADS
        for (; i < n; i++) {
            const uint8_t *rec = buf + H(i) + 12;
            if (masked(crc32c(rec, (size_t)L(i))) != get_le32(rec + L(i))) {
                found = i++;
                break;
            }
        }
        Py_END_ALLOW_THREADS
        if (found >= 0) {
            PyObject *index = PyLong_FromSsize_t(found);
            if (!index || PyList_Append(result, index) < 0) {
                Py_XDECREF(index);
                Py_CLEAR(result);
                goto done;
            }
            Py_DECREF(index);
        }
    }
#undef H
#undef L
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&heads);
    PyBuffer_Release(&lengths);
    return result;
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    int hardware = 1;
    if (!PyArg_ParseTuple(args, "y*|p", &data, &hardware)) return NULL;
    uint32_t c;
#ifdef RF_X86_CRC
    c = hardware && have_hw_crc ? crc32c_hw(data.buf, (size_t)data.len) : crc32c_sw(data.buf, (size_t)data.len);
#else
    c = crc32c_sw(data.buf, (size_t)data.len);
#endif
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"encode_examples", encode_examples, METH_VARARGS,
     "encode_examples(n, columns) -> (offsets, data): n serialized Examples (int64 offsets, n + 1)."},
    {"decode_examples", decode_examples, METH_VARARGS,
     "decode_examples(data, starts, ends) -> the map entries and values of serialized Examples."},
    {"frame_records", frame_records, METH_VARARGS,
     "frame_records(offsets, data) -> framed: the records as TFRecords, back to back."},
    {"find_records", find_records, METH_VARARGS,
     "find_records(data) -> (heads, used, bad): the whole records at the front of data."},
    {"data_crc_mismatches", data_crc_mismatches, METH_VARARGS,
     "data_crc_mismatches(data, heads, lengths) -> [i, ...]: records whose data CRC fails."},
    {"crc32c", py_crc32c, METH_VARARGS,
     "crc32c(data, hardware=True) -> int: CRC32C, unmasked (hardware=False: the table)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m) PyModule_AddIntConstant(m, "HARDWARE_CRC", have_hw_crc);
    return m;
}
