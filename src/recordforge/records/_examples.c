/* recordforge._native's encoder: conformed Arrow buffers to serialized tf.train.Examples.
 *
 * The wire grammar (the same as encoding.py's docstring states):
 *
 *     Example   = 0x0A len Features
 *     Features  = (0x0A len MapEntry)*            one per present feature, keys sorted
 *     MapEntry  = 0x0A len key  0x12 len Feature
 *     Feature   = tag len List                     tag 0x0A bytes, 0x12 float, 0x1A int64
 *     List      = (0x0A len packed-values)?        float and int64: one packed field, omitted if empty
 *               | (0x0A len value)*                bytes: one field per value
 *
 * which is protobuf's deterministic serialization of the same message, byte for byte. Every
 * length is computed in a first pass over the batch (column by column), the bytes written in a
 * second (row by row).
 */
#include "_native.h"

enum { KIND_BYTES = 0, KIND_FLOAT = 1, KIND_INT64 = 2 };
static const uint8_t FEATURE_TAG[3] = {0x0A, 0x12, 0x1A};

/* ---- one column of a batch, as the Python side describes it ---- */

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

/* Where an entry is under 128 bytes, every length in it is one byte: the common case, its
 * bytes before the values tabled by payload (Heads). */
enum { SMALL = 128 };

/* Row i's values as its List holds them, after any packed field's tag and length. */
static inline uint8_t *write_body(uint8_t *p, const Column *c, Py_ssize_t i, int64_t payload) {
    int64_t lo, hi;
    value_range(c, i, &lo, &hi);
    if (c->kind == KIND_BYTES) {
        for (int64_t j = lo; j < hi; j++) {
            int64_t a = byte_offset(c, j), b = byte_offset(c, j + 1);
            *p++ = 0x0A;
            p = put_varint(p, (uint64_t)(b - a));
            copy_small(p, c->data + a, (size_t)(b - a));
            p += b - a;
        }
        return p;
    }
    if (c->kind == KIND_FLOAT) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        copy_small(p, c->values + 4 * (c->first_value + lo), (size_t)payload);
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

static inline uint8_t *write_values(uint8_t *p, const Column *c, Py_ssize_t i, int64_t payload) {
    if (c->kind != KIND_BYTES) {
        if (!payload) return p;
        *p++ = 0x0A; /* the packed repeated field */
        p = put_varint(p, (uint64_t)payload);
    }
    return write_body(p, c, i, payload);
}

/* An entry's bytes before its values, for each payload under SMALL whose whole entry is under
 * SMALL too (every length one byte): made once per column and batch, copied once per row. */
enum { HEAD_MAX = 3 * SMALL / 2 };
typedef struct {
    uint8_t len[SMALL]; /* 0: not tabled (the entry is not small) */
    uint8_t bytes[SMALL][HEAD_MAX];
} Heads;

static void make_heads(const Column *c, Heads *h) {
    for (int64_t payload = 0; payload < SMALL; payload++) {
        int64_t list = list_len(c->kind, payload);
        int64_t feature = 1 + varint_len((uint64_t)list) + list;
        int64_t entry = c->key_len + 1 + varint_len((uint64_t)feature) + feature;
        h->len[payload] = 0;
        if (entry >= SMALL) continue;
        uint8_t *p = h->bytes[payload];
        *p++ = 0x0A;
        *p++ = (uint8_t)entry;
        memcpy(p, c->key, (size_t)c->key_len);
        p += c->key_len;
        *p++ = 0x12;
        *p++ = (uint8_t)feature;
        *p++ = FEATURE_TAG[c->kind];
        *p++ = (uint8_t)list;
        if (c->kind != KIND_BYTES && payload) {
            *p++ = 0x0A;
            *p++ = (uint8_t)payload;
        }
        h->len[payload] = (uint8_t)(p - h->bytes[payload]);
    }
}

/* An entry that is not small (Heads has it otherwise), lengths as varints. */
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
    return write_values(p, c, i, payload);
}

/* The first pass over one column: each row's payload (-1: absent) into lens[i * nc], and its
 * map entry's bytes (with the field's tag and length) added to totals[i]. Returns the first row
 * out of its buffers, or -1. Column by column, so that the kind's branches are decided once. */
static Py_ssize_t measure_column(const Column *c, Py_ssize_t n, Py_ssize_t nc, int64_t *lens, int64_t *totals) {
    int64_t small[SMALL]; /* an entry's bytes by payload, for the payloads below SMALL */
    for (int64_t p = 0; p < SMALL; p++) {
        int64_t entry = entry_len(c, p);
        small[p] = 1 + varint_len((uint64_t)entry) + entry;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t payload = -1;
        if (present(c, i)) {
            payload = payload_len(c, i);
            if (payload < 0) return i;
            if (payload < SMALL) {
                totals[i] += small[payload];
            } else {
                int64_t entry = entry_len(c, payload);
                totals[i] += 1 + varint_len((uint64_t)entry) + entry;
            }
        }
        lens[i * nc] = payload;
    }
    return -1;
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

PyObject *encode_examples(PyObject *self, PyObject *args) {
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
    Heads *heads = NULL;
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
    int64_t *totals = lens + n * nc;
    Py_BEGIN_ALLOW_THREADS
    memset(totals, 0, (size_t)n * sizeof(int64_t));
    for (Py_ssize_t k = 0; k < nc; k++) {
        Py_ssize_t row = measure_column(&cols[k], n, nc, lens + k, totals);
        if (row >= 0 && (bad < 0 || row < bad)) { /* the first bad row, and its first bad column */
            bad = row;
            bad_col = k;
        }
    }
    off[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) off[i + 1] = off[i] + 1 + varint_len((uint64_t)totals[i]) + totals[i];
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "row %zd of column %zd reaches outside its buffers", bad, bad_col);
        goto done;
    }
    data = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)off[n]);
    heads = PyMem_Malloc((size_t)(nc ? nc : 1) * sizeof(Heads));
    if (!data || !heads) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    uint8_t *out = (uint8_t *)PyByteArray_AS_STRING(data);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < nc; k++) make_heads(&cols[k], &heads[k]);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t *p = out + off[i];
        *p++ = 0x0A; /* Example.features */
        p = put_varint(p, (uint64_t)lens[n * nc + i]);
        for (Py_ssize_t k = 0; k < nc; k++) {
            int64_t payload = lens[i * nc + k];
            if (payload < 0) continue;
            const Heads *h = &heads[k];
            if (payload < SMALL && h->len[payload]) {
                copy_small(p, h->bytes[payload], h->len[payload]);
                p = write_body(p + h->len[payload], &cols[k], i, payload);
            } else {
                p = write_entry(p, &cols[k], i, payload);
            }
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
    PyMem_Free(heads);
    return result;
}

