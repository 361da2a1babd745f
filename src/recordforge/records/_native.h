/* Shared by recordforge._native's C files: byte loads and stores, varints, buffers from Python. */
#ifndef RECORDFORGE_NATIVE_H
#define RECORDFORGE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = (v << 8) | p[k];
    return v;
}

/* Offsets are read by memcpy: buffers that come out of a pickle (a Dask worker's) need not be
   aligned to 8 bytes. */
static inline int64_t load_i64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

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

/* Copies n bytes, small n (a key, a header, one entry's values) in a loop rather than a libc
   call: records are made of thousands of such pieces, most a few bytes long. */
static inline void copy_small(void *dst, const void *src, size_t n) {
    if (n > 32) {
        memcpy(dst, src, n);
        return;
    }
    uint8_t *o = dst;
    const uint8_t *i = src;
    for (; n >= 8; n -= 8, o += 8, i += 8) memcpy(o, i, 8);
    while (n--) *o++ = *i++;
}

/* encode_examples(n, columns) -> (offsets, data), in _examples.c. */
PyObject *encode_examples(PyObject *self, PyObject *args);

/* decode_examples(data, starts, ends) -> flat entries and values, in _decode.c. */
PyObject *decode_examples(PyObject *self, PyObject *args);

#endif
