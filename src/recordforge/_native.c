/* recordforge._native: conformed Arrow buffers to serialized tf.train.Examples, TFRecord framing
 * and CRC32C, finding and checking framed records: loops over whole batches (no Python call per
 * record; the GIL is released).
 *
 * The wire grammar written by encode_examples (the same as encoding.py's docstring states):
 *
 *     Example   = 0x0A len Features
 *     Features  = (0x0A len MapEntry)*            one per present feature, keys sorted
 *     MapEntry  = 0x0A len key  0x12 len Feature
 *     Feature   = tag len List                     tag 0x0A bytes, 0x12 float, 0x1A int64
 *     List      = (0x0A len packed-values)?        float and int64: one packed field, omitted if empty
 *               | (0x0A len value)*                bytes: one field per value
 *
 * which is protobuf's deterministic serialization of the same message, byte for byte. Every
 * length is computed in a first pass over the batch, the bytes written in a second.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define RF_X86_CRC 1
#endif

enum { KIND_BYTES = 0, KIND_FLOAT = 1, KIND_INT64 = 2 };
static const uint8_t FEATURE_TAG[3] = {0x0A, 0x12, 0x1A};

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

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = (v << 8) | p[k];
    return v;
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

static inline uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

/* ---- varints and little-endian stores ---- */

static inline Py_ssize_t varint_len(uint64_t v) {
    return (64 - __builtin_clzll(v | 1) + 6) / 7;
}

static inline uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline uint8_t *put_le32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
    return p + 4;
}

static inline uint8_t *put_le64(uint8_t *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (uint8_t)(v >> (8 * k));
    return p + 8;
}

/* ---- one column of a batch, as the Python side describes it ---- */

/* Offsets are read by memcpy: buffers that come out of a pickle (a Dask worker's) need not be
   aligned to 8 bytes. */
static inline int64_t load_i64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

typedef struct {
    const uint8_t *key; /* 0x0A len name: the map entry's key field */
    Py_ssize_t key_len;
    int kind;
    const uint8_t *valid; /* Arrow validity bitmap, or NULL: every row present */
    Py_ssize_t valid_bit;
    const uint8_t *rows; /* large_list offsets (int64) of row 0..n, or NULL: a scalar column */
    const uint8_t *values; /* int64, float32, or (bytes) the int64 value offsets */
    Py_ssize_t first_value; /* the values array's own offset; a scalar's row i is value first + i */
    Py_ssize_t num_values; /* values addressable from first_value on */
    const uint8_t *data; /* bytes: the value data */
    Py_ssize_t data_len;
} Column;

static inline int present(const Column *c, Py_ssize_t i) {
    if (!c->valid) return 1;
    Py_ssize_t b = c->valid_bit + i;
    return (c->valid[b >> 3] >> (b & 7)) & 1;
}

static inline void value_range(const Column *c, Py_ssize_t i, int64_t *lo, int64_t *hi) {
    if (c->rows) {
        *lo = load_i64(c->rows + 8 * i);
        *hi = load_i64(c->rows + 8 * (i + 1));
    } else {
        *lo = i;
        *hi = i + 1;
    }
}

static inline int64_t int_value(const Column *c, int64_t j) {
    int64_t v;
    memcpy(&v, c->values + 8 * (c->first_value + j), 8);
    return v;
}

static inline int64_t byte_offset(const Column *c, int64_t j) {
    int64_t v;
    memcpy(&v, c->values + 8 * (c->first_value + j), 8);
    return v;
}

/* The List body's bytes of row i (its values), or -1 where the row is out of its buffers. */
static int64_t payload_len(const Column *c, Py_ssize_t i) {
    int64_t lo, hi;
    value_range(c, i, &lo, &hi);
    if (lo < 0 || hi < lo || hi > c->num_values) return -1;
    if (c->kind == KIND_FLOAT) return 4 * (hi - lo);
    int64_t total = 0;
    if (c->kind == KIND_INT64) {
        for (int64_t j = lo; j < hi; j++) total += varint_len((uint64_t)int_value(c, j));
        return total;
    }
    for (int64_t j = lo; j < hi; j++) {
        int64_t a = byte_offset(c, j), b = byte_offset(c, j + 1);
        if (a < 0 || b < a || b > c->data_len) return -1;
        total += 1 + varint_len((uint64_t)(b - a)) + (b - a);
    }
    return total;
}

static inline int64_t list_len(int kind, int64_t payload) {
    if (kind == KIND_BYTES) return payload;
    return payload ? 1 + varint_len((uint64_t)payload) + payload : 0; /* empty: no packed field */
}

static inline int64_t entry_len(const Column *c, int64_t payload) {
    int64_t list = list_len(c->kind, payload);
    int64_t feature = 1 + varint_len((uint64_t)list) + list;
    return c->key_len + 1 + varint_len((uint64_t)feature) + feature;
}

static uint8_t *write_entry(uint8_t *p, const Column *c, Py_ssize_t i, int64_t payload) {
    int64_t list = list_len(c->kind, payload);
    int64_t feature = 1 + varint_len((uint64_t)list) + list;
    int64_t entry = c->key_len + 1 + varint_len((uint64_t)feature) + feature;
    *p++ = 0x0A; /* Features.feature: a map entry */
    p = put_varint(p, (uint64_t)entry);
    memcpy(p, c->key, (size_t)c->key_len);
    p += c->key_len;
    *p++ = 0x12; /* MapEntry.value */
    p = put_varint(p, (uint64_t)feature);
    *p++ = FEATURE_TAG[c->kind];
    p = put_varint(p, (uint64_t)list);
    int64_t lo, hi;
    value_range(c, i, &lo, &hi);
    if (c->kind == KIND_BYTES) {
        for (int64_t j = lo; j < hi; j++) {
            int64_t a = byte_offset(c, j), b = byte_offset(c, j + 1);
            *p++ = 0x0A;
            p = put_varint(p, (uint64_t)(b - a));
            memcpy(p, c->data + a, (size_t)(b - a));
            p += b - a;
        }
        return p;
    }
    if (!payload) return p;
    *p++ = 0x0A; /* the packed repeated field */
    p = put_varint(p, (uint64_t)payload);
    if (c->kind == KIND_FLOAT) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(p, c->values + 4 * (c->first_value + lo), (size_t)payload);
        p += payload;
#else
        for (int64_t j = lo; j < hi; j++) {
            uint32_t bits;
            memcpy(&bits, c->values + 4 * (c->first_value + j), 4);
            p = put_le32(p, bits);
        }
#endif
        return p;
    }
    for (int64_t j = lo; j < hi; j++) p = put_varint(p, (uint64_t)int_value(c, j));
    return p;
}

/* ---- buffers from Python ---- */

typedef struct {
    Py_buffer views[4];
    int count;
} Views;

static void release(Views *v) {
    for (int k = 0; k < v->count; k++) PyBuffer_Release(&v->views[k]);
    v->count = 0;
}

/* A readable contiguous buffer of obj (NULL data for None); its length in *len. */
static int get_buffer(Views *v, PyObject *obj, const uint8_t **data, Py_ssize_t *len) {
    if (obj == Py_None) {
        *data = NULL;
        *len = 0;
        return 0;
    }
    Py_buffer *view = &v->views[v->count];
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    v->count++;
    *data = (const uint8_t *)view->buf;
    *len = view->len;
    return 0;
}

/* Column from (key, kind, valid, valid_bit, rows, first_row, values, first_value, data). */
static int parse_column(PyObject *spec, Py_ssize_t n, Column *c, Views *v) {
    PyObject *key, *valid, *rows, *values, *data;
    Py_ssize_t first_row, num_values_bytes, key_len, valid_len, rows_len, data_len;
    const uint8_t *rows_data;
    if (!PyArg_ParseTuple(spec, "SiOnOnOnO", &key, &c->kind, &valid, &c->valid_bit, &rows, &first_row,
                          &values, &c->first_value, &data))
        return -1;
    if (c->kind < KIND_BYTES || c->kind > KIND_INT64) {
        PyErr_SetString(PyExc_ValueError, "unknown feature kind");
        return -1;
    }
    c->key = (const uint8_t *)PyBytes_AS_STRING(key);
    key_len = PyBytes_GET_SIZE(key);
    c->key_len = key_len;
    if (get_buffer(v, valid, &c->valid, &valid_len) < 0) return -1;
    if (c->valid && (c->valid_bit < 0 || (c->valid_bit + n + 7) / 8 > valid_len)) {
        PyErr_SetString(PyExc_ValueError, "validity bitmap shorter than the batch");
        return -1;
    }
    if (get_buffer(v, rows, &rows_data, &rows_len) < 0) return -1;
    c->rows = NULL;
    if (rows_data) {
        if (first_row < 0 || (first_row + n + 1) * 8 > rows_len) {
            PyErr_SetString(PyExc_ValueError, "list offsets shorter than the batch");
            return -1;
        }
        c->rows = rows_data + 8 * first_row;
    }
    if (get_buffer(v, values, &c->values, &num_values_bytes) < 0) return -1;
    Py_ssize_t width = c->kind == KIND_FLOAT ? 4 : 8;
    c->num_values = c->values ? num_values_bytes / width - c->first_value : 0;
    if (c->kind == KIND_BYTES) c->num_values -= 1; /* n + 1 offsets for n values */
    if (c->first_value < 0 || c->num_values < 0) {
        PyErr_SetString(PyExc_ValueError, "values buffer shorter than its offset");
        return -1;
    }
    if (get_buffer(v, data, &c->data, &data_len) < 0) return -1;
    c->data_len = data_len;
    if (!c->rows && c->num_values < n) {
        PyErr_SetString(PyExc_ValueError, "scalar values shorter than the batch");
        return -1;
    }
    return 0;
}

static PyObject *encode_examples(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    PyObject *specs;
    if (!PyArg_ParseTuple(args, "nO!", &n, &PyList_Type, &specs)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative row count");
        return NULL;
    }
    Py_ssize_t nc = PyList_GET_SIZE(specs);
    Column *cols = PyMem_Calloc((size_t)(nc ? nc : 1), sizeof(Column));
    Views *views = PyMem_Calloc((size_t)(nc ? nc : 1), sizeof(Views));
    /* Each row's payload per column (-1: absent), then each row's Features length. */
    int64_t *lens = PyMem_Malloc((size_t)(n * nc + n + 1) * sizeof(int64_t));
    PyObject *offsets = NULL, *data = NULL, *result = NULL;
    if (!cols || !views || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < nc; k++)
        if (parse_column(PyList_GET_ITEM(specs, k), n, &cols[k], &views[k]) < 0) goto done;
    offsets = PyByteArray_FromStringAndSize(NULL, (n + 1) * 8);
    if (!offsets) goto done;
    int64_t *off = (int64_t *)PyByteArray_AS_STRING(offsets);
    Py_ssize_t bad = -1, bad_col = 0;
    Py_BEGIN_ALLOW_THREADS
    off[0] = 0;
    for (Py_ssize_t i = 0; i < n && bad < 0; i++) {
        int64_t total = 0;
        for (Py_ssize_t k = 0; k < nc; k++) {
            const Column *c = &cols[k];
            int64_t payload = -1;
            if (present(c, i)) {
                payload = payload_len(c, i);
                if (payload < 0) {
                    bad = i;
                    bad_col = k;
                    break;
                }
                int64_t entry = entry_len(c, payload);
                total += 1 + varint_len((uint64_t)entry) + entry;
            }
            lens[i * nc + k] = payload;
        }
        lens[n * nc + i] = total;
        off[i + 1] = off[i] + 1 + varint_len((uint64_t)total) + total;
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "row %zd of column %zd reaches outside its buffers", bad, bad_col);
        goto done;
    }
    data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)off[n]);
    if (!data) goto done;
    uint8_t *out = (uint8_t *)PyByteArray_AS_STRING(data);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t *p = out + off[i];
        *p++ = 0x0A; /* Example.features */
        p = put_varint(p, (uint64_t)lens[n * nc + i]);
        for (Py_ssize_t k = 0; k < nc; k++) {
            int64_t payload = lens[i * nc + k];
            if (payload >= 0) p = write_entry(p, &cols[k], i, payload);
        }
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(2, offsets, data);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    if (views)
        for (Py_ssize_t k = 0; k < nc; k++) release(&views[k]);
    PyMem_Free(cols);
    PyMem_Free(views);
    PyMem_Free(lens);
    return result;
}

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
        memcpy(p, src + at, (size_t)len);
        p += len;
        p = put_le32(p, masked(crc32c(src + at, (size_t)len)));
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
