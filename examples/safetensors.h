/* safetensors.h - read and write safetensors files, for the examples (C99, C++, nvcc).

   The format (huggingface/safetensors): an 8-byte little-endian header length N, N
   bytes of JSON, then the data. The JSON is one object: per tensor
   "name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]} with
   offsets into the data, and an optional "__metadata__" object of string values.

   Reading is in two layers, as cgltf keeps its JSON tokenizer apart from the glTF
   interpretation: st_json_tokenize() turns any JSON text into a flat list of tokens,
   and st_read() interprets those tokens as a safetensors header (st_parse_header(),
   which st_write_file() also runs on what it is about to write) and checks every
   tensor against the file (known dtype, shape product without overflow, byte size,
   inside the data), and that the tensors tile the data exactly, as the reference
   library requires: sorted by offset, each begins where the one before ends, the
   last ends at the end of the file (no overlap, no gap, nothing after), and where the
   metadata holds st_write_file's checksum (ST_CHECKSUM), that the file is as written. Functions
   return 1 on success, or 0 with a one-line reason in err (the errsize bytes the
   caller gives). All functions are static (ST_DEF, marked unused, so a file that only
   writes builds clean under -Wall): include this in each file that uses it. */
#ifndef SAFETENSORS_H
#define SAFETENSORS_H
#if !defined(_POSIX_C_SOURCE) && !defined(_XOPEN_SOURCE) && !defined(_GNU_SOURCE)
#define _XOPEN_SOURCE 700 /* POSIX 2008 and XSI: stat, fileno, fsync, realpath (effective when included before
                             other headers; POSIX alone hid realpath from a C99 build of this file alone) */
#endif
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__) && !defined(O_TMPFILE) /* glibc shows it only under _GNU_SOURCE: Linux's generic value, as ddp.h */
#define O_TMPFILE (020000000 | O_DIRECTORY)
#endif
#if defined(__GNUC__) || defined(__clang__)
#define ST_DEF static __attribute__((unused))
#else
#define ST_DEF static
#endif

/* What a file that is not a regular one is, for an error message. */
ST_DEF const char *st_not_regular(mode_t mode)
{
    return S_ISDIR(mode) ? "is a directory" : S_ISFIFO(mode) ? "is a pipe" : "is a device or socket";
}

/* ---- reading files ----------------------------------------------------------------------
   Only regular files: a directory or a FIFO is refused by name before it is opened
   (opening a FIFO would wait for a writer). st_open gives the file and its size. */
ST_DEF FILE *st_open(const char *path, size_t *size, char *err, size_t errsize)
{
    struct stat sb;
    FILE *f;
    if (stat(path, &sb) != 0) {
        snprintf(err, errsize, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, errsize, "%s: %s, not a regular file", path, st_not_regular(sb.st_mode));
        return NULL;
    }
    if (!(f = fopen(path, "rb"))) {
        snprintf(err, errsize, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    *size = (size_t)sb.st_size;
    return f;
}

/* bytes [from, to) of f into buf + from, grown to to + 1 bytes (freed on a failure). */
ST_DEF unsigned char *st_read_more(FILE *f, unsigned char *buf, size_t from, size_t to, const char *path, char *err,
                                   size_t errsize)
{
    unsigned char *grown = (unsigned char *)realloc(buf, to + 1);
    if (!grown || fread(grown + from, 1, to - from, f) != to - from) {
        snprintf(err, errsize, "%s: %s", path, grown ? "read failed" : "out of memory");
        free(grown ? grown : buf);
        return NULL;
    }
    return grown;
}

/* A whole file in memory (size bytes). */
ST_DEF unsigned char *st_read_file(const char *path, size_t *size, char *err, size_t errsize)
{
    unsigned char *buf;
    FILE *f = st_open(path, size, err, errsize);
    if (!f) return NULL;
    buf = st_read_more(f, NULL, 0, *size, path, err, errsize);
    fclose(f);
    return buf;
}

/* ---- JSON tokens ------------------------------------------------------------------------
   Every value becomes one token, in document order; an object's keys are string tokens,
   each followed by its value. `next` is the index after the value and everything
   inside it, so a reader skips a value in one step. */
typedef enum st_json_type {
    ST_JSON_OBJECT,
    ST_JSON_ARRAY,
    ST_JSON_STRING,
    ST_JSON_NUMBER,
    ST_JSON_LITERAL /* true, false, null */
} st_json_type;

typedef struct st_json_token {
    st_json_type type;
    size_t start, end; /* the bytes of the value; a string's without its quotes */
    int size;          /* object: keys, array: elements */
    int next;          /* the token after this value */
} st_json_token;

typedef struct st_json {
    const char *s;
    size_t len, pos;
    st_json_token *tok;
    int n, cap;
    int deep; /* it failed for being nested past this reader's 64 levels, not for its syntax */
} st_json;

ST_DEF void st_json_space(st_json *j)
{
    while (j->pos < j->len && (j->s[j->pos] == ' ' || j->s[j->pos] == '\n' || j->s[j->pos] == '\t' ||
                               j->s[j->pos] == '\r'))
        j->pos++;
}

ST_DEF int st_json_peek(st_json *j, char c)
{
    st_json_space(j);
    return j->pos < j->len && j->s[j->pos] == c;
}

/* The digits at j->pos, passed over: how many. */
ST_DEF size_t st_json_digits(st_json *j)
{
    const size_t from = j->pos;
    while (j->pos < j->len && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') j->pos++;
    return j->pos - from;
}

/* One value at j->pos and everything inside it, as JSON (RFC 8259) has it; its token
   index, or -1. */
ST_DEF int st_json_value(st_json *j, int depth)
{
    int self;
    char c;
    st_json_space(j);
    if (depth > 64) j->deep = 1;
    if (j->pos >= j->len || depth > 64) return -1;
    if (j->n == j->cap) {
        int cap = j->cap ? 2 * j->cap : 256;
        st_json_token *grown = j->cap > INT_MAX / 2 || (size_t)cap > SIZE_MAX / sizeof *grown ? NULL :
                               (st_json_token *)realloc(j->tok, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        j->tok = grown;
        j->cap = cap;
    }
    self = j->n++;
    memset(&j->tok[self], 0, sizeof j->tok[self]);
    j->tok[self].start = j->pos;
    c = j->s[j->pos];
    if (c == '{' || c == '[') {
        const char close = c == '{' ? '}' : ']';
        j->tok[self].type = c == '{' ? ST_JSON_OBJECT : ST_JSON_ARRAY;
        j->pos++;
        while (!st_json_peek(j, close)) {
            if (j->tok[self].size > 0) { /* a comma between members */
                if (!st_json_peek(j, ',')) return -1;
                j->pos++;
            }
            if (c == '{') {
                int key = st_json_value(j, depth + 1);
                if (key < 0 || j->tok[key].type != ST_JSON_STRING || !st_json_peek(j, ':')) return -1;
                j->pos++;
            }
            if (st_json_value(j, depth + 1) < 0) return -1;
            j->tok[self].size++; /* by index: the recursion may have moved j->tok */
        }
        if (!st_json_peek(j, close)) return -1;
        j->pos++;
    } else if (c == '"') {
        j->tok[self].type = ST_JSON_STRING;
        j->tok[self].start = ++j->pos;
        while (j->pos < j->len && j->s[j->pos] != '"') {
            const unsigned char b = (unsigned char)j->s[j->pos];
            size_t n = b < 0x80 ? 1 : b >= 0xc2 && b < 0xe0 ? 2 : b >= 0xe0 && b < 0xf0 ? 3 : b >= 0xf0 && b < 0xf5 ? 4 : 0, e;
            if (b < 0x20 || !n || j->len - j->pos < n) return -1; /* JSON escapes control characters; UTF-8 only */
            for (e = 1; e < n; e++)
                if (((unsigned char)j->s[j->pos + e] & 0xc0) != 0x80) return -1;
            if (n == 3 && ((b == 0xe0 && (unsigned char)j->s[j->pos + 1] < 0xa0) ||   /* overlong */
                           (b == 0xed && (unsigned char)j->s[j->pos + 1] >= 0xa0)))   /* a surrogate */
                return -1;
            if (n == 4 && ((b == 0xf0 && (unsigned char)j->s[j->pos + 1] < 0x90) ||   /* overlong */
                           (b == 0xf4 && (unsigned char)j->s[j->pos + 1] >= 0x90)))   /* past U+10FFFF */
                return -1;
            if (b == '\\') { /* an escape JSON has: \" \\ \/ \b \f \n \r \t, or \u and 4 hex digits */
                const char *x = j->pos + 1 < j->len ? strchr("\"\\/bfnrtu", j->s[j->pos + 1]) : NULL;
                if (!x || !*x) return -1;
                for (e = 0; *x == 'u' && e < 4; e++)
                    if (j->pos + 2 + e >= j->len || !isxdigit((unsigned char)j->s[j->pos + 2 + e])) return -1;
                n = 2 + e;
            }
            j->pos += n;
        }
        if (j->pos >= j->len) return -1;
        j->tok[self].end = j->pos++;
        j->tok[self].next = j->n;
        return self;
    } else if (c == '-' || (c >= '0' && c <= '9')) { /* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
        j->tok[self].type = ST_JSON_NUMBER;
        j->pos += c == '-';
        if (j->pos < j->len && j->s[j->pos] == '0') j->pos++; /* a leading zero stands alone */
        else if (!st_json_digits(j)) return -1;
        if (j->pos < j->len && j->s[j->pos] == '.') {
            j->pos++;
            if (!st_json_digits(j)) return -1;
        }
        if (j->pos < j->len && (j->s[j->pos] == 'e' || j->s[j->pos] == 'E')) {
            j->pos++;
            j->pos += j->pos < j->len && (j->s[j->pos] == '+' || j->s[j->pos] == '-');
            if (!st_json_digits(j)) return -1;
        }
    } else if (j->len - j->pos >= 4 && (!memcmp(j->s + j->pos, "true", 4) || !memcmp(j->s + j->pos, "null", 4))) {
        j->tok[self].type = ST_JSON_LITERAL;
        j->pos += 4;
    } else if (j->len - j->pos >= 5 && !memcmp(j->s + j->pos, "false", 5)) {
        j->tok[self].type = ST_JSON_LITERAL;
        j->pos += 5;
    } else {
        return -1;
    }
    j->tok[self].end = j->pos;
    j->tok[self].next = j->n;
    return self;
}

/* Tokenizes text (len bytes) into j; returns 0 if it is not one JSON value (then
   j holds nothing). */
ST_DEF int st_json_tokenize(st_json *j, const char *text, size_t len)
{
    int deep;
    memset(j, 0, sizeof *j);
    j->s = text;
    j->len = len;
    if (st_json_value(j, 0) == 0 && (st_json_space(j), j->pos == len)) return 1;
    deep = j->deep;
    free(j->tok);
    memset(j, 0, sizeof *j);
    j->deep = deep;
    return 0;
}

/* A string token's text into out (cap bytes, the escapes of printable characters); 0 if
   it does not fit or holds another (\n, \u...: never in a name, and text read from a
   file goes into one-line error messages). */
ST_DEF int st_json_string(const st_json *j, int t, char *out, size_t cap)
{
    size_t i, n = 0;
    for (i = j->tok[t].start; i < j->tok[t].end; i++) {
        char c = j->s[i];
        if (c == '\\') {
            c = j->s[++i];
            if (c != '"' && c != '\\' && c != '/') return 0;
        }
        if (n + 1 >= cap) return 0;
        out[n++] = c;
    }
    out[n] = 0;
    return 1;
}

/* A number token as a non-negative integer below 2^64; 0 if it is not one. */
ST_DEF int st_json_u64(const st_json *j, int t, uint64_t *v)
{
    size_t i;
    *v = 0;
    if (j->tok[t].type != ST_JSON_NUMBER || j->tok[t].start == j->tok[t].end) return 0;
    if (j->s[j->tok[t].start] == '0' && j->tok[t].end - j->tok[t].start > 1) return 0; /* JSON has no leading zeros */
    for (i = j->tok[t].start; i < j->tok[t].end; i++) {
        const unsigned d = (unsigned)(j->s[i] - '0');
        if (d > 9 || *v > (UINT64_MAX - d) / 10) return 0;
        *v = 10 * *v + d;
    }
    return 1;
}

/* ---- safetensors: the header's meaning ------------------------------------------------- */
#define ST_MAX_DIMS 8
/* The reference library's limit: a header past it is refused before it is read, since
   its tokens take 16 times its size (a token of 32 bytes per 2 bytes of "0,"). */
#define ST_MAX_HEADER 100000000

typedef struct st_tensor {
    char name[96], dtype[16];
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    size_t numel;              /* the product of shape */
    uint64_t begin, end;       /* data_offsets */
    const unsigned char *data; /* numel elements of dtype, unaligned: read with memcpy */
} st_tensor;

typedef struct st_file {
    unsigned char *bytes; /* the whole file */
    st_tensor *t;
    int n;
    char meta_key[33][32], meta_val[33][128]; /* up to 32 of the writer's, and st_write_file's checksum */
    int n_meta;
} st_file;

ST_DEF size_t st_dtype_size(const char *dtype)
{
    static const char *const names[] = {"F64", "I64", "U64", "F32", "I32", "U32", "F16", "BF16", "I16", "U16",
                                        "I8", "U8", "BOOL"};
    static const size_t sizes[] = {8, 8, 8, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1};
    size_t i;
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(dtype, names[i]) == 0) return sizes[i];
    return 0;
}

/* "F32 [128, 32]" */
ST_DEF const char *st_describe(const st_tensor *t, char *out, size_t cap)
{
    int i, n = snprintf(out, cap, "%s [", t->dtype);
    for (i = 0; i < t->ndim && n > 0 && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, "%s%llu", i ? ", " : "", (unsigned long long)t->shape[i]);
    if (n > 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, "]");
    return out;
}

ST_DEF void st_free(st_file *f)
{
    free(f->bytes);
    free(f->t);
    memset(f, 0, sizeof *f);
}

/* ---- the checksum ------------------------------------------------------------------------
   st_write_file puts ST_CHECKSUM first in __metadata__: 16 hex digits of a 64-bit hash of
   the whole file as written, with those 16 digits as zeros: a flipped bit in a weight,
   an edited step, a shape or an offset changed all show. st_read checks it where a file
   has one (files of other writers have none), and refuses a key one bit from it (a flip
   there would turn the check off). A file rewritten by another program with the key
   kept is refused too: its bytes are not the ones hashed. It finds corruption; it is no
   signature. */
#define ST_CHECKSUM "safetensors.h checksum"
typedef struct st_hash {
    uint64_t lane[4], total;
    unsigned char part[32]; /* a block's start, until its 32 bytes are in */
    size_t have;
} st_hash;

ST_DEF uint64_t st_mix(uint64_t h, uint64_t w)
{
    h = (h ^ w) * 0x9fb21c651e98df25ull;
    return h ^ (h >> 29);
}

ST_DEF void st_hash_block(st_hash *s, const unsigned char *p) /* 32 bytes: a word to each lane */
{
    int i;
    for (i = 0; i < 4; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        s->lane[i] = st_mix(s->lane[i], w);
    }
}

ST_DEF void st_hash_start(st_hash *s)
{
    int i;
    memset(s, 0, sizeof *s);
    for (i = 0; i < 4; i++) s->lane[i] = 0x243f6a8885a308d3ull * (uint64_t)(2 * i + 1);
}

ST_DEF void st_hash_add(st_hash *s, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    s->total += n;
    while (n) {
        size_t k;
        if (!s->have && n >= 32) {
            st_hash_block(s, p);
            p += 32, n -= 32;
            continue;
        }
        k = 32 - s->have < n ? 32 - s->have : n;
        memcpy(s->part + s->have, p, k);
        p += k, n -= k, s->have += k;
        if (s->have == 32) st_hash_block(s, s->part), s->have = 0;
    }
}

ST_DEF uint64_t st_hash_end(st_hash *s)
{
    uint64_t h = s->total;
    int i;
    if (s->have) { /* the last bytes, zero-padded (the length above tells 0 from no byte) */
        memset(s->part + s->have, 0, 32 - s->have);
        st_hash_block(s, s->part);
    }
    for (i = 0; i < 4; i++) h = st_mix(h, s->lane[i]);
    return st_mix(h, h >> 31);
}

/* Where the checksum's 16 digits are in a header (the one place this writer puts them), or NULL. */
ST_DEF unsigned char *st_checksum_at(unsigned char *header, size_t len)
{
    static const char key[] = "\"" ST_CHECKSUM "\":\"";
    size_t i, n = sizeof key - 1;
    unsigned char *at = NULL;
    for (i = 0; i + n + 17 <= len; i++)
        if (memcmp(header + i, key, n) == 0) {
            if (at || header[i + n + 16] != '"') return NULL; /* twice, or not 16 digits */
            at = header + i + n;
        }
    return at;
}

/* One tensor's object (token t) into ts, checked against the data's size (its data
   pointer is set once the data is read). */
ST_DEF int st_read_tensor(const st_json *j, int t, st_tensor *ts, size_t size, char *err, size_t errsize)
{
    char key[32];
    uint64_t off[2] = {0, 0}, bytes;
    int k = t + 1, i, seen = 0;
    if (j->tok[t].type != ST_JSON_OBJECT) {
        snprintf(err, errsize, "tensor %s is not an object", ts->name);
        return 0;
    }
    for (i = 0; i < j->tok[t].size; i++, k = j->tok[k + 1].next) {
        const int v = k + 1, len = j->tok[v].size;
        const st_json_type type = j->tok[v].type;
        int e, ok = 0, field;
        if (!st_json_string(j, k, key, sizeof key)) { /* "dt\u0079pe" is dtype to other readers: a second one */
            if (memchr(j->s + j->tok[k].start, '\\', j->tok[k].end - j->tok[k].start)) {
                snprintf(err, errsize, "tensor %s has a key with an escape other than \\\" \\\\ \\/", ts->name);
                return 0;
            }
            key[0] = 0; /* long, so none of the three */
        }
        field = strcmp(key, "dtype") == 0 ? 1 : strcmp(key, "shape") == 0 ? 2 : strcmp(key, "data_offsets") == 0 ? 4 : 0;
        if (seen & field) { /* readers differ on which one counts, as for a name twice */
            snprintf(err, errsize, "tensor %s has '%s' twice", ts->name, key);
            return 0;
        }
        seen |= field;
        if (field == 1) {
            ok = type == ST_JSON_STRING && st_json_string(j, v, ts->dtype, sizeof ts->dtype);
        } else if (field == 2) {
            if (type == ST_JSON_ARRAY && len > ST_MAX_DIMS) {
                snprintf(err, errsize, "tensor %s has %d dimensions, %d at most: past this reader's limits "
                         "(examples/safetensors.h), though the format allows it", ts->name, len, ST_MAX_DIMS);
                return 0;
            }
            ok = type == ST_JSON_ARRAY;
            for (e = 0; ok && e < len; e++) ok = st_json_u64(j, v + 1 + e, &ts->shape[e]);
            ts->ndim = len;
        } else if (field == 4) {
            ok = type == ST_JSON_ARRAY && len == 2 && st_json_u64(j, v + 1, &off[0]) && st_json_u64(j, v + 2, &off[1]);
        } else {
            ok = 1; /* another key: ignored, as the format's own reader does */
        }
        if (!ok) {
            snprintf(err, errsize, "tensor %s: bad entry '%s'", ts->name, key);
            return 0;
        }
    }
    if (seen != 7) {
        snprintf(err, errsize, "tensor %s lacks dtype, shape or data_offsets", ts->name);
        return 0;
    }
    if (!st_dtype_size(ts->dtype)) { /* the format's dtypes of under a byte, 8-bit floats, complex numbers */
        static const char *const other[] = {"F4", "F6_E2M3", "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0", "C64"};
        size_t o;
        for (o = 0; o < sizeof other / sizeof other[0] && strcmp(ts->dtype, other[o]) != 0; o++) {}
        if (o < sizeof other / sizeof other[0])
            snprintf(err, errsize, "tensor %s has the dtype '%s': past this reader's limits (examples/safetensors.h), "
                     "though the format allows it", ts->name, ts->dtype);
        else
            snprintf(err, errsize, "tensor %s has the unknown dtype '%s'", ts->name, ts->dtype);
        return 0;
    }
    bytes = st_dtype_size(ts->dtype);
    for (i = 0; i < ts->ndim; i++) { /* numel and bytes without overflow */
        if (ts->shape[i] && bytes > UINT64_MAX / ts->shape[i]) {
            snprintf(err, errsize, "tensor %s: its shape's size overflows", ts->name);
            return 0;
        }
        bytes *= ts->shape[i];
    }
    if (off[1] < off[0] || off[1] > size || off[1] - off[0] != bytes) {
        snprintf(err, errsize,
                 "tensor %s: data_offsets [%llu, %llu] do not hold its shape's %llu bytes in the %zu of data", ts->name,
                 (unsigned long long)off[0], (unsigned long long)off[1], (unsigned long long)bytes, size);
        return 0;
    }
    ts->numel = (size_t)(bytes / st_dtype_size(ts->dtype));
    ts->begin = off[0];
    ts->end = off[1];
    return 1;
}

ST_DEF const char *st_meta(const st_file *f, const char *key)
{
    int i;
    for (i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return "";
}

/* A metadata value as an integer in [lo, hi] (0 <= lo <= hi), written as the examples
   write it: digits only, no sign, space or leading zero, as a reader in another language
   parses it (strtol's " +01" would be 1 here and an error there). 0 if it is not one. */
ST_DEF int st_meta_int(const st_file *f, const char *key, int lo, int hi, int *out)
{
    const char *v = st_meta(f, key);
    int x = 0;
    if (!*v || (v[0] == '0' && v[1])) return 0;
    for (; *v; v++) { /* (x > hi / 10 first: 10 x + d cannot overflow after it) */
        if (*v < '0' || *v > '9' || x > hi / 10 || 10 * x > hi - (*v - '0')) return 0;
        x = 10 * x + (*v - '0');
    }
    *out = x;
    return x >= lo;
}

ST_DEF int st_by_name(const void *a, const void *b)
{
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* The tensors sorted by cmp, as pointers (free them), or NULL with "out of memory". */
ST_DEF const st_tensor **st_sorted(const st_file *f, int (*cmp)(const void *, const void *), char *why, size_t whysize)
{
    const st_tensor **order = (const st_tensor **)malloc(sizeof *order * ((size_t)f->n + 1));
    int i;
    if (!order) {
        snprintf(why, whysize, "out of memory");
        return NULL;
    }
    for (i = 0; i < f->n; i++) order[i] = &f->t[i];
    qsort(order, (size_t)f->n, sizeof *order, cmp);
    return order;
}

/* Every tensor's name once: readers differ on which of two counts (the first here, the
   last in the reference), so a file with one name twice means different things to each. */
ST_DEF int st_unique(const st_file *f, char *why, size_t whysize)
{
    const st_tensor **order = st_sorted(f, st_by_name, why, whysize);
    int i;
    if (!order) return 0;
    for (i = 1; i < f->n && strcmp(order[i - 1]->name, order[i]->name) != 0; i++) {}
    if (i < f->n) snprintf(why, whysize, "tensor %s is named twice", order[i]->name);
    free(order);
    return i >= f->n;
}

ST_DEF int st_by_offset(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->begin != y->begin ? (x->begin > y->begin ? 1 : -1) : x->end != y->end ? (x->end > y->end ? 1 : -1) : 0;
}

/* The tensors, in offset order, cover the data (size bytes) exactly once: two tensors
   that share bytes would load as one another's. */
ST_DEF int st_tiles(const st_file *f, size_t size, char *why, size_t whysize)
{
    const st_tensor **order = st_sorted(f, st_by_offset, why, whysize);
    uint64_t at = 0;
    int i;
    if (!order) return 0;
    for (i = 0; i < f->n && order[i]->begin == at; i++) at = order[i]->end;
    if (i < f->n)
        snprintf(why, whysize, "tensor %s: data_offsets [%llu, %llu] %s: the tensors before it end at %llu "
                 "(tensors must tile the data, no overlap, no gap)", order[i]->name,
                 (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end,
                 order[i]->begin < at ? "overlap another tensor" : "leave a gap", (unsigned long long)at);
    else if (at != size)
        snprintf(why, whysize, "%llu bytes of data after the last tensor", (unsigned long long)(size - at));
    free(order);
    return i == f->n && at == size;
}

/* The edits (a byte changed, added or left out) that make a into b, for names of 32 bytes
   at most; past `most`, most + 1. */
ST_DEF int st_edits(const char *a, const char *b, int most)
{
    int row[33], i, k;
    const int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 32 || lb > 32 || la - lb > most || lb - la > most) return most + 1;
    for (k = 0; k <= lb; k++) row[k] = k;
    for (i = 1; i <= la; i++) { /* row: a's first i bytes against b's first k */
        int diag = row[0], least = i;
        row[0] = i;
        for (k = 1; k <= lb; k++) {
            int d = diag + (a[i - 1] != b[k - 1]);
            if (row[k] + 1 < d) d = row[k] + 1;
            if (row[k - 1] + 1 < d) d = row[k - 1] + 1;
            diag = row[k];
            row[k] = d;
            if (d < least) least = d;
        }
        if (least > most) return most + 1;
    }
    return row[lb] > most ? most + 1 : row[lb];
}

/* The header (hlen bytes of JSON) of a file with data_size bytes of data into f's tensors
   and metadata, checked as st_read checks it: 1, or 0 with why said (f's arrays are freed
   by st_free either way). st_write_file checks its header with it first. */
ST_DEF int st_parse_header(st_file *f, const char *header, size_t hlen, size_t data_size, char *why, size_t whysize)
{
    st_json j;
    int i, k, entries, metadata = 0;
    if (!st_json_tokenize(&j, header, hlen) || j.tok[0].type != ST_JSON_OBJECT) {
        snprintf(why, whysize, j.deep ? "nested more than 64 deep: past this reader's limits (examples/safetensors.h), "
                 "though the format allows it" : "not a JSON object");
        free(j.tok);
        return 0;
    }
    entries = j.tok[0].size;
    f->t = (st_tensor *)calloc((size_t)entries + 1, sizeof(st_tensor));
    snprintf(why, whysize, "out of memory");
    for (i = 0, k = 1; f->t && i < entries; i++, k = j.tok[k + 1].next) {
        char key[96];
        if (!st_json_string(&j, k, key, sizeof key)) {
            if (j.tok[k].end - j.tok[k].start < sizeof key)
                snprintf(why, whysize, "a name with an escape other than \\\" \\\\ \\/ (\\n, \\u...: not in a name here)");
            else
                snprintf(why, whysize, "a name longer than %zu bytes: past this reader's limits "
                         "(examples/safetensors.h), though the format allows it", sizeof key - 1);
            break;
        }
        if (strcmp(key, "__metadata__") == 0) { /* string values only, as the format says */
            /* (null: none, as the format's own reader takes it) */
            const int count = j.tok[k + 1].type == ST_JSON_OBJECT ? j.tok[k + 1].size
                              : j.tok[k + 1].type == ST_JSON_LITERAL && j.s[j.tok[k + 1].start] == 'n' ? 0 : -1;
            int m, e = k + 2, o, twice = 0, sum = 0;
            if (metadata++) {
                snprintf(why, whysize, "two __metadata__ objects");
                break;
            }
            const char *bad = count < 0 ? "is not an object" : NULL;
            for (m = 0; m < count && f->n_meta < 33 && !twice && !bad; m++, e = j.tok[e + 1].next, f->n_meta++) {
                if (!st_json_string(&j, e, f->meta_key[f->n_meta], sizeof f->meta_key[0]))
                    bad = "has a key of 32 bytes or more, or with an escape other than \\\" \\\\ \\/";
                else if (j.tok[e + 1].type != ST_JSON_STRING)
                    bad = "has a value that is not a string (the format's metadata maps strings to strings)";
                else if (!st_json_string(&j, e + 1, f->meta_val[f->n_meta], sizeof f->meta_val[0]))
                    bad = "has a value of 128 bytes or more, or with an escape other than \\\" \\\\ \\/";
                if (bad) break;
                sum |= strcmp(f->meta_key[f->n_meta], ST_CHECKSUM) == 0; /* a 33rd key: the checksum of 32 */
                for (o = 0; o < f->n_meta; o++) twice |= strcmp(f->meta_key[o], f->meta_key[f->n_meta]) == 0;
            }
            if (twice) { /* readers differ on which one counts */
                snprintf(why, whysize, "__metadata__ has the key '%s' twice", f->meta_key[f->n_meta - 1]);
                break;
            }
            if (!bad && (m < count || f->n_meta > 32 + sum)) bad = "has more than 32 keys (and the checksum)";
            if (bad) { /* (the keys and values past these bounds are this reader's limits, not the format's) */
                snprintf(why, whysize, "__metadata__ %s%s", bad, count < 0 || strstr(bad, "not a string") ? "" :
                         ": past this reader's limits (examples/safetensors.h), though the format allows it");
                break;
            }
        } else {
            st_tensor *t = &f->t[f->n++];
            snprintf(t->name, sizeof t->name, "%s", key);
            if (!st_read_tensor(&j, k + 1, t, data_size, why, whysize)) break;
        }
    }
    free(j.tok);
    if (f->t && i == entries && (!st_unique(f, why, whysize) || !st_tiles(f, data_size, why, whysize))) i = -1;
    if (!f->t || i < entries) return 0;
    for (i = 0; i < f->n_meta && strcmp(f->meta_key[i], ST_CHECKSUM) != 0; i++)
        if (st_edits(f->meta_key[i], ST_CHECKSUM, 3) <= 3) { /* a damaged key would turn the check off */
            snprintf(why, whysize, "the metadata key '%s' is a few bytes from '%s'", f->meta_key[i], ST_CHECKSUM);
            return 0;
        }
    return 1;
}

/* Reads and checks the whole file: the header's syntax and meaning, every tensor
   inside the data. The length first, then the header, the data last: a file that is
   none (8 GB of something else) costs 8 bytes of reading, not 8 GB. */
ST_DEF int st_read(st_file *f, const char *path, char *err, size_t errsize)
{
    char why[400];
    uint64_t hlen = 0;
    size_t size, data_size;
    int i;
    FILE *in;
    memset(f, 0, sizeof *f);
    if (!(in = st_open(path, &size, err, errsize))) return 0;
    if (!(f->bytes = st_read_more(in, NULL, 0, size < 8 ? size : 8, path, err, errsize))) {
        fclose(in);
        return 0;
    }
    for (i = 0; i < 8 && size >= 8; i++) hlen |= (uint64_t)f->bytes[i] << (8 * i);
    if (size < 8 || hlen < 2 || hlen > size - 8) {
        snprintf(err, errsize, "%s: not a safetensors file (truncated or bad header length)", path);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        snprintf(err, errsize, "%s: a safetensors header of %llu bytes, past the %d the format allows", path,
                 (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    if (!(f->bytes = st_read_more(in, f->bytes, 8, 8 + (size_t)hlen, path, err, errsize))) goto fail;
    data_size = size - 8 - (size_t)hlen;
    if (!st_parse_header(f, (const char *)f->bytes + 8, (size_t)hlen, data_size, why, sizeof why)) {
        if (strcmp(why, "not a JSON object") == 0) snprintf(err, errsize, "%s: corrupt safetensors header (%s)", path, why);
        else snprintf(err, errsize, "%s: %s safetensors header: %s", path, strstr(why, "this reader's limits") ?
                      "unsupported" : "corrupt", why);
        goto fail;
    }
    if (!(f->bytes = st_read_more(in, f->bytes, 8 + (size_t)hlen, size, path, err, errsize))) goto fail;
    fclose(in);
    in = NULL;
    for (i = 0; i < f->n_meta && strcmp(f->meta_key[i], ST_CHECKSUM) != 0; i++)
        ; /* the checksum's key, if the file has one */
    if (i < f->n_meta) { /* written by st_write_file (empty or not): the file must be as written */
        unsigned char *at = st_checksum_at(f->bytes + 8, (size_t)hlen), digits[16];
        char want[17];
        st_hash h;
        for (i = 0; at && i < 16; i++) at = isxdigit(at[i]) && !isupper(at[i]) ? at : NULL;
        if (!at) {
            snprintf(err, errsize, "%s: corrupt safetensors header: its checksum is not 16 hex digits where "
                     "safetensors.h writes it", path);
            goto fail;
        }
        memcpy(digits, at, 16);
        memset(at, '0', 16);
        st_hash_start(&h);
        st_hash_add(&h, f->bytes, size);
        memcpy(at, digits, 16);
        snprintf(want, sizeof want, "%016llx", (unsigned long long)st_hash_end(&h));
        if (memcmp(want, digits, 16) != 0) {
            snprintf(err, errsize, "%s: checksum mismatch (%.16s in the file, %s of its bytes): it changed after it "
                     "was written (a flipped bit, an edit, or a rewrite that kept the metadata: without the key "
                     "'%s' it loads unchecked)", path, (const char *)digits, want, ST_CHECKSUM);
            goto fail;
        }
    }
    for (i = 0; i < f->n; i++) f->t[i].data = f->bytes + 8 + hlen + f->t[i].begin;
    return 1;
fail:
    if (in) fclose(in);
    st_free(f);
    return 0;
}

ST_DEF const st_tensor *st_find(const st_file *f, const char *name)
{
    int i;
    for (i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

/* ---- writing ----------------------------------------------------------------------------
   st_put appends printf-style text to a growing header; st_write_file writes header and
   data arrays to a new file beside FILE, flushes, fsyncs and renames it, so FILE is
   always whole. On Linux the new file has no name while it is written (O_TMPFILE,
   st_temp_unnamed) and gets one (FILE.tmp or FILE.tmp.XXXXXX) only once whole, just
   before the rename: a save killed mid-write leaves nothing behind. Elsewhere, or where
   the file system cannot, it is made by name (st_temp), and a save killed while it
   writes leaves that name, which no later save removes (not knowing it its own). */
typedef struct st_text {
    char *s;
    size_t len, cap;
    int failed;
} st_text;

ST_DEF void st_put(st_text *t, const char *fmt, ...)
{
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || t->failed) {
        t->failed = 1;
        return;
    }
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = 2 * (t->len + (size_t)n + 1);
        char *s = (char *)realloc(t->s, cap);
        if (!s) {
            t->failed = 1;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* The shortest decimal text that reads back as x: metadata values are text, and a
   setting compared as text must not differ by a rounding. */
ST_DEF const char *st_float(char *out, size_t cap, float x)
{
    int digits;
    for (digits = 1; digits < 9; digits++) {
        snprintf(out, cap, "%.*g", digits, (double)x);
        if (strtof(out, NULL) == x) return out;
    }
    snprintf(out, cap, "%.9g", (double)x);
    return out;
}

/* The k-th name st_temp tries for path, into tmp (cap bytes): FILE.tmp, then FILE.tmp.XXXXXX. */
ST_DEF void st_temp_name(const char *path, int k, char *tmp, size_t cap)
{
    const unsigned x = ((unsigned)getpid() * 2654435761u) ^ ((unsigned)time(NULL) * 40503u) ^ ((unsigned)k * 97u);
    if (k == 0) snprintf(tmp, cap, "%s.tmp", path);
    else snprintf(tmp, cap, "%s.tmp.%06x", path, x & 0xffffffu);
}

/* A new file beside path for a save to rename into place, its name in tmp (cap bytes):
   FILE.tmp (when plain), or, where that name is taken, FILE.tmp.XXXXXX. O_EXCL: a file
   this call made, never one that was there (a killed save's, a link, someone's data: not
   ours to remove or write through). The descriptor, or -1 with errno set. */
ST_DEF int st_temp(const char *path, int plain, char *tmp, size_t cap)
{
    int fd, k;
    for (k = !plain; k < 100; k++) { /* (a name taken: the next try's k gives another) */
        st_temp_name(path, k, tmp, cap);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

/* The directory a path names a file in ("." for a bare name), into out (cap bytes). */
ST_DEF const char *st_parent(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    snprintf(out, cap, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    return out;
}

/* A new file without a name in path's directory, for a save to write (Linux's O_TMPFILE):
   if the process dies before st_name_temp names it, it vanishes with the process (a file
   made by name stays, checkpoint-sized, and no later save may remove a name it did not
   make). The descriptor, or -1 where the kernel or the file system cannot make one, or
   /proc (to name it by) is missing: then st_temp. */
ST_DEF int st_temp_unnamed(const char *path)
{
#ifdef O_TMPFILE
    char dir[1024];
    if (access("/proc/self/fd", X_OK) != 0) return -1;
    return open(st_parent(path, dir, sizeof dir), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
#else
    (void)path;
    return -1;
#endif
}

/* Names st_temp_unnamed's file fd beside path with the first of st_temp's names that is
   free, into tmp (cap bytes): linkat never replaces a name that is there (EEXIST, as
   O_EXCL), so a link, a killed save's file or someone's data keeps its name. 1, or 0
   with errno set. */
ST_DEF int st_name_temp(int fd, const char *path, char *tmp, size_t cap)
{
    char proc[64];
    int k;
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    for (k = 0; k < 100; k++) { /* (a name taken: the next try's k gives another) */
        st_temp_name(path, k, tmp, cap);
        if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0) return 1;
        if (errno != EEXIST) return 0;
    }
    return 0;
}

/* Where name leads (into out, cap bytes): the name, or through its links (up to 8), a
   dangling one too: --log l, with l a link to the --save file not yet there, opens that
   file, which the save's rename then replaces. */
ST_DEF void st_follow(const char *name, char *out, size_t cap)
{
    char target[1024], dir[1024], next[2200];
    struct stat sl;
    ssize_t n;
    int depth;
    snprintf(out, cap, "%s", name);
    for (depth = 0; depth < 8 && lstat(out, &sl) == 0 && S_ISLNK(sl.st_mode); depth++) {
        if ((n = readlink(out, target, sizeof target - 1)) <= 0) return;
        target[n] = 0;
        if (target[0] == '/') snprintf(next, sizeof next, "%s", target);
        else snprintf(next, sizeof next, "%s/%s", st_parent(out, dir, sizeof dir), target);
        if (strlen(next) >= cap) return;
        memcpy(out, next, strlen(next) + 1);
    }
}

/* Whether two names are one file (--save x --trace ./x): the later write would replace
   the other without a word. The same file when both exist; else, where they lead
   (st_follow), the same directory (resolved: x, ./x and d/../x are one) and the same
   last name. */
ST_DEF int st_same_file(const char *a, const char *b)
{
    char names[2][1100], *dir[2] = {NULL, NULL};
    const char *base[2];
    struct stat sa, sb;
    int k, same;
    if (!a || !b) return 0;
    if (strcmp(a, b) == 0) return 1;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    for (k = 0; k < 2; k++) {
        char parent[1024];
        st_follow(k ? b : a, names[k], sizeof names[k]);
        base[k] = strrchr(names[k], '/') ? strrchr(names[k], '/') + 1 : names[k];
        dir[k] = realpath(st_parent(names[k], parent, sizeof parent), NULL);
    }
    same = dir[0] && dir[1] ? strcmp(dir[0], dir[1]) == 0 && strcmp(base[0], base[1]) == 0 : 0;
    free(dir[0]);
    free(dir[1]);
    return same;
}

/* Whether this process may rename over another user's file in a sticky directory:
   CAP_FOWNER (bit 3 of /proc/self/status's CapEff; root's, unless dropped). */
ST_DEF int st_has_cap_fowner(void)
{
    char line[256];
    unsigned long long caps = 0;
    int found = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && !found && fgets(line, sizeof line, f)) found = sscanf(line, "CapEff: %llx", &caps) == 1;
    if (f) fclose(f);
    return found ? (int)((caps >> 3) & 1) : geteuid() == 0;
}

/* A file that a run writes later (a checkpoint, a log) can be written now: a name, not a
   directory, in a directory this process may create files in. 0 with the reason in err
   (flag: the option that named it), so that a run refuses at its start, not after hours.
   What is there already must be a regular file: a save's rename would put a file in the
   place of a device or a FIFO, and opening a FIFO as a log waits for a reader forever.
   renamed: written to a file beside it, then renamed over it (a save): that file is made
   and removed now, under the longest name a save may write first (the file system takes
   the name, the directory a new file), and the name there must be one this process may
   replace (in a sticky directory such as /tmp: its own, or the directory's). Else (a log)
   a file there is opened for writing, as the log will be, and stays as it is; a new
   one's name must fit the file system's NAME_MAX. */
ST_DEF int st_writable(const char *flag, const char *path, int renamed, char *err, size_t errsize)
{
    char dir[1024], probe[1100];
    struct stat sb, sd;
    int fd;
    if (!*path || strlen(path) > 1000) {
        snprintf(err, errsize, "%s needs a file name of 1 to 1000 bytes", flag);
        return 0;
    }
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        snprintf(err, errsize, "%s %s %s, not a regular file: give a file name", flag, path, st_not_regular(sb.st_mode));
        return 0;
    }
    if (!renamed && access(path, F_OK) == 0) { /* opened in place, as the log will be: it stays as it is */
        if ((fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666)) < 0) {
            snprintf(err, errsize, "%s %s: cannot write it: %s", flag, path, strerror(errno));
            return 0;
        }
        close(fd);
        return 1;
    }
    if (access(st_parent(path, dir, sizeof dir), W_OK | X_OK) != 0) {
        snprintf(err, errsize, "%s %s: cannot create files in %s: %s", flag, path, dir, strerror(errno));
        return 0;
    }
    if (!renamed) { /* a new file: the directory takes one (above), and its name */
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        const long most = pathconf(dir, _PC_NAME_MAX);
        if (most > 0 && (long)strlen(base) > most) {
            snprintf(err, errsize, "%s %s: the name is too long for the file system there (%ld bytes at most)", flag,
                     path, most);
            return 0;
        }
        return 1;
    }
    /* the rename replaces the name (a link, not what it points to): in a sticky directory
       only the name's owner or the directory's may (else the run trains, then fails) */
    if (lstat(path, &sb) == 0 && stat(dir, &sd) == 0 && (sd.st_mode & S_ISVTX) && sb.st_uid != geteuid() &&
        sd.st_uid != geteuid() && !st_has_cap_fowner()) {
        snprintf(err, errsize, "%s %s: that name is another user's, in a sticky directory (as /tmp): this run could not "
                 "replace it; give another name", flag, path);
        return 0;
    }
    if ((fd = st_temp(path, 0, probe, sizeof probe)) < 0) {
        if (errno == ENAMETOOLONG)
            snprintf(err, errsize, "%s %s: the name is too long for the file system there (a save writes "
                     "NAME.tmp.XXXXXX first)", flag, path);
        else
            snprintf(err, errsize, "%s %s: cannot create files in %s: %s", flag, path, dir, strerror(errno));
        return 0;
    }
    close(fd);
    unlink(probe); /* made by st_temp: ours */
    return 1;
}

/* Writes the 8 bytes of length, the header and the n arrays to f, then flushes and
   fsyncs: 1, or 0 with errno set. */
ST_DEF int st_write_bytes(FILE *f, const unsigned char *len8, const st_text *header, const void *const *arrays,
                          const size_t *bytes, int n)
{
    int i, ok = fwrite(len8, 8, 1, f) == 1 && fwrite(header->s, 1, header->len, f) == header->len;
    for (i = 0; i < n; i++) ok = ok && fwrite(arrays[i], 1, bytes[i], f) == bytes[i];
    return ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
}

/* The file written unnamed (st_temp_unnamed) and named tmp (cap bytes) once whole: 1;
   0 after a write error (err says it: full, ulimit -f, which by name would fail too);
   -1 where the file cannot be made or named here (then by name). */
ST_DEF int st_write_unnamed(const char *path, const unsigned char *len8, const st_text *header,
                            const void *const *arrays, const size_t *bytes, int n, char *tmp, size_t cap, char *err,
                            size_t errsize)
{
    const int fd = st_temp_unnamed(path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    int named;
    if (!f) {
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!st_write_bytes(f, len8, header, arrays, bytes, n)) {
        snprintf(err, errsize, "cannot write checkpoint %s: %s", path, strerror(errno));
        fclose(f); /* the file goes with its last descriptor */
        return 0;
    }
    named = st_name_temp(fileno(f), path, tmp, cap);
    if (fclose(f) != 0 && named) {
        snprintf(err, errsize, "cannot write checkpoint %s: %s", tmp, strerror(errno));
        remove(tmp); /* named by this call (linkat): ours */
        return 0;
    }
    return named ? 1 : -1; /* no name: written again, by name, where the error (if any) is said */
}

/* JSON's white space from s on */
static size_t st_ws(const char *s, size_t i, size_t len)
{
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* The checksum's place, 16 zeros, put first in header's __metadata__ (made if there is
   none): 1, also where it is there already (a header written before); 0 when out of
   memory; -1 when __metadata__ is not the header's first key. */
ST_DEF int st_put_checksum(st_text *header)
{
    static const char name[] = "\"__metadata__\"", ours[] = "\"" ST_CHECKSUM "\":\"";
    const size_t len = header->s ? header->len : 0, m = sizeof name - 1;
    size_t i = st_ws(header->s, 1, len), at;
    int has = i + m <= len && memcmp(header->s + i, name, m) == 0;
    char next;
    st_text t;
    memset(&t, 0, sizeof t);
    if (header->failed || len < 2 || header->s[0] != '{') return 0;
    if (has) { /* {"__metadata__":{ with white space anywhere between */
        i = st_ws(header->s, i + m, len);
        has = i < len && header->s[i] == ':' && (i = st_ws(header->s, i + 1, len)) < len && header->s[i] == '{';
    }
    at = has ? i + 1 : 1; /* after the object's opening brace */
    i = st_ws(header->s, at, len);
    next = i < len ? header->s[i] : '}';
    if (has && len - i >= sizeof ours - 1 && memcmp(header->s + i, ours, sizeof ours - 1) == 0) return 1;
    if (!has && strstr(header->s, "\"__metadata__\"")) return -1; /* a second __metadata__ would go in front */
    st_put(&t, "%.*s%s\"" ST_CHECKSUM "\":\"0000000000000000\"%s%s%s", (int)at, header->s,
           has ? "" : "\"__metadata__\":{", has ? "" : "}", next == '}' ? "" : ",", header->s + at);
    if (t.failed) return 0;
    free(header->s);
    *header = t;
    return 1;
}

/* header: the JSON of one object (padded here to a multiple of 8; a checksum goes into
   its __metadata__, which must come first if there is one; the same header may be
   written again); then n arrays of bytes[i] bytes. The data is written as this
   machine stores it: little-endian on x86 and ARM. The file is written unnamed where it
   can be (st_write_unnamed), else by name (st_temp). */
ST_DEF int st_write_file(const char *path, st_text *header, const void *const *arrays, const size_t *bytes, int n,
                         char *err, size_t errsize)
{
    char tmp[1100], digits[17];
    unsigned char len8[8], *at;
    FILE *f = NULL;
    int i, ok, fd;
    st_hash h;
    if ((i = st_put_checksum(header)) < 0) {
        snprintf(err, errsize, "%s: st_write_file wants __metadata__ first in the header ({\"__metadata__\":{...),"
                 " where its checksum goes", path);
        return 0;
    }
    if (!i) header->failed = 1;
    while (!header->failed && header->len % 8) st_put(header, " ");
    if (header->failed) {
        snprintf(err, errsize, "%s: out of memory for the header", path);
        return 0;
    }
    if (strlen(path) > 1000) { /* FILE.tmp would be cut to another name */
        snprintf(err, errsize, "cannot write checkpoint %.100s...: its name is longer than 1000 bytes", path);
        return 0;
    }
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header->len >> (8 * i));
    at = st_checksum_at((unsigned char *)header->s, header->len);
    if (!at) { /* a name of the caller's ST_CHECKSUM too */
        snprintf(err, errsize, "%s: the header has a \"%s\" of its own", path, ST_CHECKSUM);
        return 0;
    }
    memset(at, '0', 16); /* (a header written before holds that write's) */
    { /* what st_read would refuse is not written (a second __metadata__, a value it cannot take,
         offsets that do not tile the arrays): the save fails now, not the load later */
        st_file chk;
        size_t data = 0;
        char why[400];
        for (i = 0; i < n; i++) data += bytes[i];
        memset(&chk, 0, sizeof chk);
        ok = header->len <= ST_MAX_HEADER && st_parse_header(&chk, header->s, header->len, data, why, sizeof why);
        if (header->len > ST_MAX_HEADER) snprintf(why, sizeof why, "longer than the %d bytes allowed", ST_MAX_HEADER);
        st_free(&chk);
        if (!ok) {
            snprintf(err, errsize, "%s: a header st_read would refuse: %s", path, why);
            return 0;
        }
    }
    st_hash_start(&h);
    st_hash_add(&h, len8, 8);
    st_hash_add(&h, header->s, header->len);
    for (i = 0; i < n; i++) st_hash_add(&h, arrays[i], bytes[i]);
    snprintf(digits, sizeof digits, "%016llx", (unsigned long long)st_hash_end(&h));
    memcpy(at, digits, 16);
    if ((ok = st_write_unnamed(path, len8, header, arrays, bytes, n, tmp, sizeof tmp, err, errsize)) == 0) return 0;
    if (ok < 0) {
        if ((fd = st_temp(path, 1, tmp, sizeof tmp)) < 0 || !(f = fdopen(fd, "wb"))) {
            const int e = errno;
            if (fd >= 0) close(fd), remove(tmp); /* made by this call (O_EXCL): ours */
            snprintf(err, errsize, "cannot write checkpoint %s: %s", path, strerror(e));
            return 0;
        }
        ok = st_write_bytes(f, len8, header, arrays, bytes, n);
        ok = fclose(f) == 0 && ok;
        if (!ok) snprintf(err, errsize, "cannot write checkpoint %s: %s", tmp, strerror(errno));
    }
    if (ok && rename(tmp, path) != 0) {
        snprintf(err, errsize, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        ok = 0;
    }
    if (!ok) remove(tmp); /* made by this call (O_EXCL, or linkat): ours */
    return ok;
}
#endif
