/* recordforge._native's decoder: a batch of serialized tf.train.Examples to their map entries
 * and values grouped by feature name, in two passes (tools/wire.py makes the columns).
 *
 * The grammar taken (the one _examples.c writes, and protobuf's own serialization):
 *
 *     Example   = 0x0A len Features                 ending the record (or an empty record)
 *     Features  = (0x0A len MapEntry)*              each key once
 *     MapEntry  = 0x0A len key  0x12 len Feature    ending the entry
 *     Feature   = (tag len List)?                   tag 0x0A bytes, 0x12 float, 0x1A int64
 *     List      = (0x0A len packed)?                float and int64: one packed field, whole
 *               | (0x0A len value)*                 bytes: one field per value
 *
 * A record outside it (another field order, unpacked numbers, an unknown field, a key twice or
 * not UTF-8, a length past its span, a float list not a multiple of 4 bytes, a varint over 10 bytes) is
 * marked `slow` and none of its entries is kept: wire.py gives it to protobuf, which parses
 * what it accepts and names what it refuses. Every read is bounded by the record's span.
 *
 * Keys are interned as they are met: a record's keys usually come in the order of the record
 * before, so each is first compared with the key that followed the previous one last time,
 * then looked up in a hash table of the names met.
 */
#include "_native.h"

#include <stdlib.h>

enum { NONE = 0, BYTES = 1, FLOAT = 2, INT64 = 3 }; /* wire.py's codes */

typedef struct {
    uint8_t *p;
    size_t len, cap; /* bytes */
} Grow;

static int grow_to(Grow *g, size_t need) {
    size_t cap = g->cap ? g->cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(g->p, cap);
    if (!p) return -1;
    g->p = p;
    g->cap = cap;
    return 0;
}

static inline int push(Grow *g, const void *v, size_t n) {
    if (g->len + n > g->cap && grow_to(g, g->len + n) < 0) return -1;
    copy_small(g->p + g->len, v, n);
    g->len += n;
    return 0;
}

static inline int push_i64(Grow *g, int64_t v) { return push(g, &v, 8); }
static inline int push_i32(Grow *g, int32_t v) { return push(g, &v, 4); }

/* A varint at *pos, before end: 0 and its value, or -1 (cut short, or over 10 bytes). */
static inline int get_varint(const uint8_t *d, int64_t *pos, int64_t end, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (*pos >= end) return -1;
        uint8_t b = d[(*pos)++];
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A field of tag `tag` (one byte, wire type 2) at *pos, within end: its value's [start, stop). */
static inline int get_field(const uint8_t *d, int64_t *pos, int64_t end, uint8_t tag, int64_t *start,
                            int64_t *stop) {
    if (*pos >= end || d[*pos] != tag) return -1;
    (*pos)++;
    uint64_t len;
    if (get_varint(d, pos, end, &len) < 0 || len > (uint64_t)(end - *pos)) return -1;
    *start = *pos;
    *stop = *pos + (int64_t)len;
    *pos = *stop;
    return 0;
}

/* ---- the names met ---- */

/* Whether p[0, n) is well-formed UTF-8 (no overlong forms, no surrogates, at most U+10FFFF):
   map keys are proto3 strings, and protobuf refuses a record whose key is not. */
static int is_utf8(const uint8_t *p, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint32_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return 0;
        }
        if (i + more >= n) return 0; /* cut short */
        if (p[i + 1] < lo || p[i + 1] > hi) return 0;
        for (int k = 2; k <= more; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return 0;
        i += more + 1;
    }
    return 1;
}

typedef struct {
    const uint8_t *d;
    Grow start, len, next, last_rec, utf8; /* int64, int64, int32 (predicted next key), int64, uint8 */
    int32_t *slots;                  /* hash table of key ids, -1 empty */
    size_t nslots;
    int32_t count;
} Keys;

static uint64_t key_hash(const uint8_t *p, int64_t n) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

static inline int key_is(const Keys *k, int32_t id, int64_t s, int64_t n) {
    const int64_t *starts = (const int64_t *)k->start.p, *lens = (const int64_t *)k->len.p;
    if (lens[id] != n) return 0;
    const uint8_t *a = k->d + starts[id], *b = k->d + s;
    if (n > 16) return memcmp(a, b, (size_t)n) == 0;
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static int rehash(Keys *k, size_t nslots) {
    int32_t *slots = malloc(nslots * sizeof(int32_t));
    if (!slots) return -1;
    for (size_t i = 0; i < nslots; i++) slots[i] = -1;
    const int64_t *starts = (const int64_t *)k->start.p, *lens = (const int64_t *)k->len.p;
    for (int32_t id = 0; id < k->count; id++) {
        size_t i = key_hash(k->d + starts[id], lens[id]) & (nslots - 1);
        while (slots[i] >= 0) i = (i + 1) & (nslots - 1);
        slots[i] = id;
    }
    free(k->slots);
    k->slots = slots;
    k->nslots = nslots;
    return 0;
}

/* The id of key d[s, s + n), added if new; `prev` the record's previous key (-1 at its start,
 * where the guess is `first`). -1: out of memory. */
static int32_t key_id(Keys *k, int64_t s, int64_t n, int32_t prev, int32_t *first) {
    int32_t guess = prev < 0 ? *first : ((int32_t *)k->next.p)[prev];
    int32_t id = -1;
    if (guess >= 0 && key_is(k, guess, s, n)) {
        id = guess;
    } else {
        size_t i = key_hash(k->d + s, n) & (k->nslots - 1);
        for (; k->slots[i] >= 0; i = (i + 1) & (k->nslots - 1))
            if (key_is(k, k->slots[i], s, n)) {
                id = k->slots[i];
                break;
            }
        if (id < 0) {
            id = k->count++;
            uint8_t utf8 = (uint8_t)is_utf8(k->d + s, n);
            if (push_i64(&k->start, s) < 0 || push_i64(&k->len, n) < 0 || push_i32(&k->next, -1) < 0 ||
                push_i64(&k->last_rec, -1) < 0 || push(&k->utf8, &utf8, 1) < 0)
                return -1;
            if ((size_t)k->count * 2 > k->nslots) {
                if (rehash(k, k->nslots * 2) < 0) return -1;
            } else {
                k->slots[i] = id;
            }
        }
    }
    if (prev < 0)
        *first = id;
    else
        ((int32_t *)k->next.p)[prev] = id;
    return id;
}

/* ---- pass 1: entries in record order ---- */

typedef struct {
    Grow rec, id, kind, count, first; /* int64, int32, uint8, int64, int64 (its kind's values) */
    Grow ints, floats, bstarts, bends;
} Flat;

#define FLAT_FIELDS 9

static Grow *flat_field(Flat *f, int k) { return &((Grow *)f)[k]; }

/* One Feature's list [ls, le) of kind `kind`: its values appended, their count in *count. */
static int list_values(const uint8_t *d, int kind, int64_t ls, int64_t le, Flat *f, int64_t *count) {
    *count = 0;
    if (ls == le) return 0;
    int64_t pos = ls, s, e;
    if (kind == BYTES) {
        while (pos < le) {
            if (get_field(d, &pos, le, 0x0A, &s, &e) < 0) return -1;
            if (push_i64(&f->bstarts, s) < 0 || push_i64(&f->bends, e) < 0) return -2;
            (*count)++;
        }
        return 0;
    }
    if (get_field(d, &pos, le, 0x0A, &s, &e) < 0 || e != le) return -1;
    if (kind == FLOAT) {
        if ((e - s) & 3) return -1;
        if (push(&f->floats, d + s, (size_t)(e - s)) < 0) return -2; /* little-endian float32 */
        *count = (e - s) >> 2;
        return 0;
    }
    while (s < e) {
        uint64_t v;
        if (get_varint(d, &s, e, &v) < 0) return -1;
        if (push_i64(&f->ints, (int64_t)v) < 0) return -2;
        (*count)++;
    }
    return 0;
}

/* Record r's entries appended (0), or -1 where it is outside the grammar, -2 out of memory. */
static int record_entries(const uint8_t *d, int64_t start, int64_t end, int64_t r, Flat *f, Keys *k,
                          int32_t *first_key) {
    if (start == end) return 0;
    int64_t pos = start, fs, fe;
    if (get_field(d, &pos, end, 0x0A, &fs, &fe) < 0 || fe != end) return -1;
    pos = fs;
    int32_t prev = -1;
    while (pos < fe) {
        int64_t es, ee, ks, ke, vs, ve;
        if (get_field(d, &pos, fe, 0x0A, &es, &ee) < 0) return -1;
        int64_t at = es;
        if (get_field(d, &at, ee, 0x0A, &ks, &ke) < 0) return -1;
        if (get_field(d, &at, ee, 0x12, &vs, &ve) < 0 || ve != ee) return -1;
        uint8_t kind = NONE;
        int64_t ls = vs, le = vs;
        if (vs < ve) {
            uint8_t tag = d[vs];
            if (tag != 0x0A && tag != 0x12 && tag != 0x1A) return -1;
            at = vs;
            if (get_field(d, &at, ve, tag, &ls, &le) < 0 || le != ve) return -1;
            kind = (uint8_t)(tag >> 3);
        }
        int32_t id = key_id(k, ks, ke - ks, prev, first_key);
        if (id < 0) return -2;
        int64_t *last = (int64_t *)k->last_rec.p;
        if (last[id] == r || !k->utf8.p[id]) return -1; /* a key twice (protobuf keeps the last), or not UTF-8 */
        last[id] = r;
        prev = id;
        int64_t first = kind == INT64   ? (int64_t)(f->ints.len / 8)
                        : kind == FLOAT ? (int64_t)(f->floats.len / 4)
                                        : (int64_t)(f->bstarts.len / 8);
        int64_t count = 0;
        int got = list_values(d, kind, ls, le, f, &count);
        if (got < 0) return got;
        if (push_i64(&f->rec, r) < 0 || push_i32(&f->id, id) < 0 || push(&f->kind, &kind, 1) < 0 ||
            push_i64(&f->count, count) < 0 || push_i64(&f->first, first) < 0)
            return -2;
    }
    return 0;
}

/* ---- pass 2: grouped by key, record order kept within a key ---- */

enum { G_REC, G_KIND, G_COUNT, G_INTS, G_FLOATS, G_BSTARTS, G_BENDS, G_BOUNDS, G_N };

/* Output arrays as bytearrays: entries and values grouped by key id; G_BOUNDS holds, per key,
 * (entries, ints, floats, bytes values) cumulative counts: 4 * (keys + 1) int64s. */
static int group(const Flat *f, int32_t nkeys, PyObject **out) {
    size_t n = f->rec.len / 8;
    size_t sizes[G_N] = {n * 8, n, n * 8, f->ints.len, f->floats.len, f->bstarts.len, f->bends.len,
                         (size_t)(nkeys + 1) * 4 * 8};
    for (int g = 0; g < G_N; g++) {
        out[g] = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)sizes[g]);
        if (!out[g]) return -1;
    }
    int64_t *bounds = (int64_t *)PyByteArray_AS_STRING(out[G_BOUNDS]);
    memset(bounds, 0, sizes[G_BOUNDS]);
    const int64_t *rec = (const int64_t *)f->rec.p, *count = (const int64_t *)f->count.p;
    const int64_t *first = (const int64_t *)f->first.p;
    const int32_t *id = (const int32_t *)f->id.p;
    const uint8_t *kind = f->kind.p;
    /* kind -> which of the three value counts (1 ints, 2 floats, 3 bytes), 0: none */
    static const int slot[4] = {0, 3, 2, 1};
    for (size_t e = 0; e < n; e++) {
        int64_t *b = bounds + 4 * ((size_t)id[e] + 1);
        b[0]++;
        if (slot[kind[e]]) b[slot[kind[e]]] += count[e];
    }
    for (int32_t i = 0; i < nkeys; i++)
        for (int c = 0; c < 4; c++) bounds[4 * (i + 1) + c] += bounds[4 * i + c];
    int64_t *at = malloc((size_t)(nkeys ? nkeys : 1) * 4 * sizeof(int64_t));
    if (!at) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(at, bounds, (size_t)nkeys * 4 * sizeof(int64_t));
    int64_t *o_rec = (int64_t *)PyByteArray_AS_STRING(out[G_REC]);
    uint8_t *o_kind = (uint8_t *)PyByteArray_AS_STRING(out[G_KIND]);
    int64_t *o_count = (int64_t *)PyByteArray_AS_STRING(out[G_COUNT]);
    int64_t *o_ints = (int64_t *)PyByteArray_AS_STRING(out[G_INTS]);
    uint8_t *o_floats = (uint8_t *)PyByteArray_AS_STRING(out[G_FLOATS]);
    int64_t *o_bs = (int64_t *)PyByteArray_AS_STRING(out[G_BSTARTS]);
    int64_t *o_be = (int64_t *)PyByteArray_AS_STRING(out[G_BENDS]);
    const int64_t *ints = (const int64_t *)f->ints.p, *bs = (const int64_t *)f->bstarts.p;
    const int64_t *be = (const int64_t *)f->bends.p;
    Py_BEGIN_ALLOW_THREADS
    for (size_t e = 0; e < n; e++) {
        int64_t *a = at + 4 * (size_t)id[e];
        int64_t j = a[0]++, c = count[e];
        o_rec[j] = rec[e];
        o_kind[j] = kind[e];
        o_count[j] = c;
        if (kind[e] == INT64) {
            copy_small(o_ints + a[1], ints + first[e], (size_t)c * 8);
            a[1] += c;
        } else if (kind[e] == FLOAT) {
            copy_small(o_floats + 4 * a[2], f->floats.p + 4 * first[e], (size_t)c * 4);
            a[2] += c;
        } else if (kind[e] == BYTES) {
            copy_small(o_bs + a[3], bs + first[e], (size_t)c * 8);
            copy_small(o_be + a[3], be + first[e], (size_t)c * 8);
            a[3] += c;
        }
    }
    Py_END_ALLOW_THREADS
    free(at);
    return 0;
}

/* decode_examples(data, starts, ends) -> (key_starts, key_lengths, rec, kind, count, ints, floats,
 * bytes_starts, bytes_ends, bounds, slow): bytearrays, see wire.py. */
PyObject *decode_examples(PyObject *self, PyObject *args) {
    Py_buffer data, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &starts, &ends)) return NULL;
    PyObject *result = NULL, *slow = NULL, *grouped[G_N] = {NULL};
    Flat f;
    Keys k;
    memset(&f, 0, sizeof f);
    memset(&k, 0, sizeof k);
    k.d = data.buf;
    Py_ssize_t n = starts.len / 8;
    if (ends.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "starts and ends differ in length");
        goto done;
    }
    if (rehash(&k, 64) < 0 || !(slow = PyByteArray_FromStringAndSize(NULL, n))) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    uint8_t *slow_p = (uint8_t *)PyByteArray_AS_STRING(slow);
    const uint8_t *d = data.buf;
    int64_t limit = data.len;
    int32_t first_key = -1;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n && !failed; r++) {
        int64_t s = load_i64((const uint8_t *)starts.buf + 8 * r);
        int64_t e = load_i64((const uint8_t *)ends.buf + 8 * r);
        size_t marks[FLAT_FIELDS];
        for (int j = 0; j < FLAT_FIELDS; j++) marks[j] = flat_field(&f, j)->len;
        int got = (s < 0 || e < s || e > limit) ? -1 : record_entries(d, s, e, r, &f, &k, &first_key);
        slow_p[r] = got == -1;
        if (got == -1)
            for (int j = 0; j < FLAT_FIELDS; j++) flat_field(&f, j)->len = marks[j];
        failed = got == -2;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (group(&f, k.count, grouped) < 0) goto done;
    result = PyTuple_New(G_N + 3);
    if (!result) goto done;
    PyObject *key_starts = PyByteArray_FromStringAndSize((const char *)k.start.p, (Py_ssize_t)k.start.len);
    PyObject *key_lens = PyByteArray_FromStringAndSize((const char *)k.len.p, (Py_ssize_t)k.len.len);
    if (!key_starts || !key_lens) {
        Py_XDECREF(key_starts);
        Py_XDECREF(key_lens);
        Py_CLEAR(result);
        goto done;
    }
    PyTuple_SET_ITEM(result, 0, key_starts);
    PyTuple_SET_ITEM(result, 1, key_lens);
    for (int g = 0; g < G_N; g++) {
        PyTuple_SET_ITEM(result, 2 + g, grouped[g]); /* the tuple takes the reference */
        grouped[g] = NULL;
    }
    PyTuple_SET_ITEM(result, 2 + G_N, slow);
    slow = NULL;
done:
    Py_XDECREF(slow);
    for (int g = 0; g < G_N; g++) Py_XDECREF(grouped[g]);
    for (int j = 0; j < FLAT_FIELDS; j++) free(flat_field(&f, j)->p);
    free(k.start.p);
    free(k.len.p);
    free(k.next.p);
    free(k.last_rec.p);
    free(k.utf8.p);
    free(k.slots);
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}
