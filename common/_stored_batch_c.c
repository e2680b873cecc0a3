/* The compiled twin of common/_stored_batch_py.py: the stored batch's (v2 and v3) encode, checks, stamp and
 * the client's per-message decode, with the same names, signatures, bytes, values and errors
 * (tests/common/test_stored_batch.py runs both and compares them). It never trusts a length
 * before checking it against the buffer, and raises MalformedBatchError for every bad batch.
 *
 * The types it returns (BatchHeader, ProducerSequence, BatchMessage) and the functions it calls
 * once per batch or per distinct tag (crc32c, tag_hash) are the twin's own objects, looked up at
 * import: one definition of each, and the CRC comes from the crc32c package, not from here.
 * Objects are filled through their slots (the frozen dataclasses' __init__ would cost ~1 us).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define FIXED_HEADER_BYTES 64
#define RECORD_HEAD_BYTES 28
#define KIND_PRODUCE 1
#define VERSION 3        /* the newest version read (the twin's VERSION) */
#define OLDEST_VERSION 2 /* still read everywhere */
#define V3_HEADER_BYTES 72 /* v3: v2's fixed header, then the born base (i64) at 64 */
#define V3_MIN_RECORD 3
/* v3 record head attributes: which optional fields follow the born delta and body length */
#define V3_FLAG 0x01
#define V3_TAG 0x02
#define V3_KEYS 0x04
#define V3_PROPS 0x08
#define V3_ATTRS (V3_FLAG | V3_TAG | V3_KEYS | V3_PROPS)
#define STATE_PRODUCED 0
#define STATE_STAMPED 1
#define STATE_PLACED 2 /* stamped, and the base offset is the leader's (common/_stored_batch_py.py) */
#define HAS_PRODUCER 0x0001
/* The producer's sequence must follow the last stored one (only with HAS_PRODUCER). */
#define STRICT_SEQUENCE 0x0002
/* Some message carries keys: the dispatcher walks the records for the key index only then. */
#define HAS_KEYS 0x0004
/* A delayed send's batch (the broker's own write, _stored_batch_py.mark_scheduled). */
#define SCHEDULED 0x0008
#define KNOWN_FLAGS (HAS_PRODUCER | STRICT_SEQUENCE | HAS_KEYS | SCHEDULED)
/* v3 only: no message has a tag, and the tag-hash table is left out (every hash 0) */
#define NO_TAG_HASHES 0x0010
#define KNOWN_FLAGS_V3 (KNOWN_FLAGS | NO_TAG_HASHES)
#define NO_TAG 0xFFFF
#define U16_MAX 0xFFFFu
#define U32_MAX 0xFFFFFFFFu
#define STAMP_CRC_AT 8
#define BODY_CRC_AT 12
#define STAMP_AT 16
#define BODY_AT 32
#define STATE_AT 2
#define COUNT_AT 40

/* ---- objects of the twin, set at import ------------------------------------------------------ */

static PyObject *MalformedBatchError;
static PyObject *UnsupportedBatchError;
static PyObject *DefaultLimits;
static PyObject *CrcFn;     /* crc32c.crc32c */
static PyObject *TagHashFn; /* common.filter.tag.tag_hash */
static PyTypeObject *BatchHeaderType, *BatchMessageType, *ProducerSequenceType, *MessageType;

enum { H_TOPIC, H_QUEUE_ID, H_COUNT, H_PRODUCER, H_BORN_HOST, H_STAMPED, H_BASE_OFFSET, H_STORE_MS,
       H_TOTAL_BYTES, H_TABLES_AT, H_RECORDS_AT, H_VERSION, H_BORN_BASE, H_N };
static const char *HeaderFields[H_N] = {
    "topic", "queue_id", "count", "producer", "born_host", "stamped", "base_offset",
    "store_timestamp_ms", "total_bytes", "tables_at", "records_at", "version", "born_base_ms"};
static Py_ssize_t HeaderSlots[H_N];

enum { P_PRODUCER_ID, P_FIRST_SEQUENCE, P_STRICT, P_N };
static const char *ProducerFields[P_N] = {"producer_id", "first_sequence", "strict"};
static Py_ssize_t ProducerSlots[P_N];

enum { B_BATCH, B_DATA, B_END, B_HEAD, B_POS, B_QUEUE_OFFSET, B_TAG_HASH, B_N };
static const char *MessageSlotNames[B_N] = {
    "_batch", "_data", "_end", "_head", "_pos", "queue_offset", "tag_hash"};
static Py_ssize_t MessageSlots[B_N];

enum { M_TOPIC, M_BODY, M_TAGS, M_KEYS, M_PROPERTIES, M_FLAG, M_BORN_MS, M_BORN_HOST, M_N };
static const char *MessageFields[M_N] = {
    "topic", "body", "tags", "keys", "properties", "flag", "born_timestamp_ms", "born_host"};
static Py_ssize_t MessageFieldSlots[M_N];
static PyObject *MessageFieldNames[M_N]; /* interned, for objects that are not exactly Message */

/* ---- little helpers -------------------------------------------------------------------------- */

static inline uint16_t rd16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void wr16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void wr32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void wr64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

/* ---- v3 record heads: varints (the twin's _uvarint, _zigzag, _v3_head) ----------------------- */

/* v as an unsigned LEB128 varint at out (when not NULL); its length in bytes. */
static int put_uvarint(unsigned char *out, uint64_t v)
{
    int n = 0;
    while (v >= 0x80) {
        if (out != NULL) out[n] = (unsigned char)((v & 0x7F) | 0x80);
        n++;
        v >>= 7;
    }
    if (out != NULL) out[n] = (unsigned char)v;
    return n + 1;
}

static inline uint64_t zigzag(int64_t d) { return ((uint64_t)d << 1) ^ (uint64_t)(d >> 63); }
static inline int64_t unzigzag(uint64_t z) { return (int64_t)((z >> 1) ^ (~(z & 1) + 1)); }

/* A record head, either version's, as the twin's seven fields (born time absolute). */
typedef struct {
    uint32_t body_len, keys_len, props_len;
    int32_t flag;
    int64_t born;
    unsigned tag_len, n_keys;
} RecHead;

enum { HEAD_OK = 0, HEAD_OVERRUN = 1, HEAD_BAD = 2 };

static int get_uvarint(const unsigned char *d, int64_t *pos, int64_t end, uint64_t *out)
{
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= end) return HEAD_OVERRUN;
        unsigned b = d[(*pos)++];
        if (shift == 63 && b > 1) return HEAD_BAD;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = v;
            return HEAD_OK;
        }
        shift += 7;
    }
}

/* The head of the record at d[pos:end]: HEAD_OK with *at where its fields (tag, keys,
 * properties, body) start, or HEAD_OVERRUN / HEAD_BAD; the same checks, in the same order, as
 * the twin's _v3_head (v3) or its struct unpack (v2). */
static int read_head(const unsigned char *d, int64_t pos, int64_t end, int version,
                     int64_t born_base, RecHead *h, int64_t *at)
{
    if (version == OLDEST_VERSION) {
        if (pos + RECORD_HEAD_BYTES > end) return HEAD_OVERRUN;
        const unsigned char *p = d + pos;
        h->body_len = rd32(p);
        h->flag = (int32_t)rd32(p + 4);
        h->born = (int64_t)rd64(p + 8);
        h->tag_len = rd16(p + 16);
        h->n_keys = rd16(p + 18);
        h->keys_len = rd32(p + 20);
        h->props_len = rd32(p + 24);
        *at = pos + RECORD_HEAD_BYTES;
        return HEAD_OK;
    }
    if (pos >= end) return HEAD_OVERRUN;
    unsigned attrs = d[pos++];
    if (attrs & ~(unsigned)V3_ATTRS) return HEAD_BAD;
    /* every varint first (the twin's order), then the fields' ranges */
    int n = 2 + (attrs & V3_FLAG ? 1 : 0) + (attrs & V3_TAG ? 1 : 0) + (attrs & V3_KEYS ? 2 : 0) +
            (attrs & V3_PROPS ? 1 : 0);
    uint64_t vals[7];
    for (int i = 0; i < n; i++) {
        if (pos < end && d[pos] < 0x80) { /* one byte: nearly every field of a small message */
            vals[i] = d[pos++];
            continue;
        }
        int rc = get_uvarint(d, &pos, end, &vals[i]);
        if (rc != HEAD_OK) return rc;
    }
    uint64_t zz = vals[0];
    int bad = vals[1] > U32_MAX, k = 2;
    h->body_len = (uint32_t)vals[1];
    h->flag = 0;
    h->tag_len = NO_TAG;
    h->n_keys = 0;
    h->keys_len = h->props_len = 0;
    if (attrs & V3_FLAG) {
        int64_t f = unzigzag(vals[k++]);
        bad |= f < INT32_MIN || f > INT32_MAX;
        h->flag = (int32_t)f;
    }
    if (attrs & V3_TAG) {
        bad |= vals[k] >= NO_TAG;
        h->tag_len = (unsigned)vals[k++];
    }
    if (attrs & V3_KEYS) {
        bad |= vals[k] > U16_MAX || vals[k + 1] > U32_MAX;
        h->n_keys = (unsigned)vals[k];
        h->keys_len = (uint32_t)vals[k + 1];
        k += 2;
    }
    if (attrs & V3_PROPS) {
        bad |= vals[k] > U32_MAX;
        h->props_len = (uint32_t)vals[k];
    }
    if (bad) return HEAD_BAD;
    h->born = (int64_t)((uint64_t)born_base + (uint64_t)unzigzag(zz));
    *at = pos;
    return HEAD_OK;
}

/* The bytes a record spans from its head's start, given the head ended at `at`. */
static inline int64_t record_size(const RecHead *h, int64_t pos, int64_t at)
{
    return (at - pos) + (int64_t)h->body_len + h->keys_len + h->props_len +
           (h->tag_len == NO_TAG ? 0 : h->tag_len);
}

static PyObject *malformed(const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *text = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (text != NULL) {
        PyErr_SetObject(MalformedBatchError, text);
        Py_DECREF(text);
    }
    return NULL;
}

/* A newer format's batch (version or flag unknown here): the twin's UnsupportedBatchError. */
static PyObject *unsupported(const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *text = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (text != NULL) {
        PyErr_SetObject(UnsupportedBatchError, text);
        Py_DECREF(text);
    }
    return NULL;
}

/* Python's f"{v:#010x}" */
static void hex32(char out[11], uint32_t v) { snprintf(out, 11, "0x%08x", (unsigned)v); }

/* The offset of an object slot (a __slots__ member) of `type`, or -1 with ImportError set. */
static Py_ssize_t slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_ImportError, "%s.%s is not a slot: the C codec does not match the twin",
                     type->tp_name, name);
        return -1;
    }
    return ((PyMemberDescrObject *)d)->d_member->offset;
}

/* The slots of `type` must be exactly `names` (so that filling them makes a whole object). */
static int slot_offsets(PyTypeObject *type, const char **names, Py_ssize_t *out, Py_ssize_t n)
{
    PyObject *slots = PyObject_GetAttrString((PyObject *)type, "__slots__");
    if (slots == NULL) return -1;
    Py_ssize_t have = PyObject_Length(slots);
    Py_DECREF(slots);
    if (have != n) {
        PyErr_Format(PyExc_ImportError, "%s has %zd slots, the C codec knows %zd", type->tp_name,
                     have, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((out[i] = slot_offset(type, names[i])) < 0) return -1;
    }
    return 0;
}

/* A new instance of a slots class with every slot set; steals the references in `values` (also
 * on failure; a NULL value means a failed allocation). */
static PyObject *fill(PyTypeObject *type, const Py_ssize_t *offsets, PyObject **values, Py_ssize_t n)
{
    PyObject *obj = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (values[i] == NULL) goto fail;
    }
    obj = type->tp_alloc(type, 0);
    if (obj == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        *(PyObject **)((char *)obj + offsets[i]) = values[i];
    }
    return obj;
fail:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(values[i]);
    return NULL;
}

/* crc32c(data, init), through the crc32c package (which releases the GIL on large buffers). */
static int crc_of(const void *data, Py_ssize_t n, uint32_t init, uint32_t *out)
{
    PyObject *args[2];
    args[0] = PyMemoryView_FromMemory((char *)data, n, PyBUF_READ);
    if (args[0] == NULL) return -1;
    args[1] = PyLong_FromUnsignedLong(init);
    if (args[1] == NULL) {
        Py_DECREF(args[0]);
        return -1;
    }
    PyObject *r = PyObject_Vectorcall(CrcFn, args, 2, NULL);
    Py_DECREF(args[0]);
    Py_DECREF(args[1]);
    if (r == NULL) return -1;
    unsigned long v = PyLong_AsUnsignedLong(r);
    Py_DECREF(r);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* The stamp CRC: bytes [0, 8) and [12, 32), in one call. */
static int stamp_crc(const unsigned char *p, uint32_t *out)
{
    unsigned char tmp[BODY_AT - 4];
    memcpy(tmp, p, STAMP_CRC_AT);
    memcpy(tmp + STAMP_CRC_AT, p + BODY_CRC_AT, BODY_AT - BODY_CRC_AT);
    return crc_of(tmp, sizeof tmp, 0, out);
}

/* ---- encoding -------------------------------------------------------------------------------- */

typedef struct {
    PyObject *tag;  /* str or NULL (no tag) */
    const char *tag_p;
    Py_ssize_t tag_n;
    PyObject *keys;  /* PySequence_Fast of the keys */
    PyObject *props; /* the properties mapping */
    Py_buffer body;
    int has_body;
    int32_t flag;
    int64_t born;
    uint64_t keys_len, props_len, code, size;
} MsgInfo;

/* A message field (a new reference): read from the slot for an exact Message, else getattr. */
static PyObject *field(PyObject *m, int i)
{
    if (Py_IS_TYPE(m, MessageType)) {
        PyObject *v = *(PyObject **)((char *)m + MessageFieldSlots[i]);
        if (v == NULL) {
            PyErr_Format(PyExc_AttributeError, "Message has no value for %s", MessageFields[i]);
            return NULL;
        }
        Py_INCREF(v);
        return v;
    }
    return PyObject_GetAttr(m, MessageFieldNames[i]);
}

static PyObject *does_not_fit(const char *what)
{
    PyErr_Format(PyExc_ValueError, "a message field does not fit the stored batch format: %s",
                 what);
    return NULL;
}

/* The utf-8 of a header string, refused past a u16 length as the twin's _short(). */
static const char *short_utf8(PyObject *s, const char *what, Py_ssize_t *n)
{
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", what, Py_TYPE(s)->tp_name);
        return NULL;
    }
    const char *p = PyUnicode_AsUTF8AndSize(s, n);
    if (p == NULL) return NULL;
    if (*n > (Py_ssize_t)U16_MAX) {
        PyObject *head = PyUnicode_Substring(s, 0, 40);
        if (head != NULL) {
            PyErr_Format(PyExc_ValueError, "%s of %zd bytes exceeds %u: %R...", what, *n,
                         (unsigned)U16_MAX, head);
            Py_DECREF(head);
        }
        return NULL;
    }
    return p;
}

static int str_utf8(PyObject *s, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "message strings must be str, not %.100s",
                     Py_TYPE(s)->tp_name);
        return -1;
    }
    *p = PyUnicode_AsUTF8AndSize(s, n);
    return *p == NULL ? -1 : 0;
}

/* The tag's hash, once per distinct tag of a batch (the twin's tag_cache). */
static int tag_code(PyObject *tag, PyObject **cache, uint64_t *code)
{
    PyObject *v = NULL;
    if (*cache == NULL && (*cache = PyDict_New()) == NULL) return -1;
    v = PyDict_GetItemWithError(*cache, tag);
    if (v == NULL) {
        if (PyErr_Occurred()) return -1;
        v = PyObject_CallOneArg(TagHashFn, tag);
        if (v == NULL) return -1;
        int rc = PyDict_SetItem(*cache, tag, v);
        Py_DECREF(v);
        if (rc < 0) return -1;
    }
    *code = PyLong_AsUnsignedLongLong(v);
    if (*code == (uint64_t)-1 && PyErr_Occurred()) return -1;
    return 0;
}

static int int_in(PyObject *v, long long lo, long long hi, long long *out)
{
    if (!PyLong_Check(v)) return -1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

/* Pass one over a message: checks, lengths and the objects pass two writes from. */
static int measure(PyObject *m, PyObject *topic, PyObject *host, MsgInfo *mi, PyObject **cache,
                   PyObject **last_tag, uint64_t *last_code)
{
    PyObject *v = field(m, M_TOPIC);
    if (v == NULL) return -1;
    int eq = PyObject_RichCompareBool(v, topic, Py_EQ);
    if (eq <= 0) {
        if (eq == 0)
            PyErr_Format(PyExc_ValueError, "message for topic %R in a batch for topic %R", v,
                         topic);
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    if ((v = field(m, M_BORN_HOST)) == NULL) return -1;
    int truth = PyObject_IsTrue(v);
    eq = truth > 0 ? PyObject_RichCompareBool(v, host, Py_EQ) : 1;
    if (truth < 0 || eq <= 0) {
        if (truth >= 0 && eq == 0)
            PyErr_Format(PyExc_ValueError, "message born on %R in a batch from %R", v, host);
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);

    if ((mi->tag = field(m, M_TAGS)) == NULL) return -1;
    if (mi->tag == Py_None) {
        Py_CLEAR(mi->tag);
        mi->tag_n = -1;
        mi->code = 0;
    } else {
        if (str_utf8(mi->tag, &mi->tag_p, &mi->tag_n) < 0) return -1;
        if (mi->tag == *last_tag) {
            mi->code = *last_code;
        } else {
            if (mi->tag_n >= NO_TAG) {
                PyErr_Format(PyExc_ValueError, "tag of %zd bytes is too long", mi->tag_n);
                return -1;
            }
            if (tag_code(mi->tag, cache, &mi->code) < 0) return -1;
            *last_tag = mi->tag;
            *last_code = mi->code;
        }
    }

    if ((v = field(m, M_KEYS)) == NULL) return -1;
    mi->keys = PySequence_Fast(v, "message keys must be a sequence of str");
    Py_DECREF(v);
    if (mi->keys == NULL) return -1;
    Py_ssize_t n_keys = PySequence_Fast_GET_SIZE(mi->keys);
    PyObject **keys = PySequence_Fast_ITEMS(mi->keys);
    for (Py_ssize_t i = 0; i < n_keys; i++) {
        const char *p;
        Py_ssize_t n;
        if (str_utf8(keys[i], &p, &n) < 0) return -1;
        if (n > (Py_ssize_t)U16_MAX) {
            does_not_fit("a key exceeds 65535 bytes");
            return -1;
        }
        mi->keys_len += 2 + (uint64_t)n;
    }

    if ((mi->props = field(m, M_PROPERTIES)) == NULL) return -1;
    if (!PyDict_Check(mi->props)) {
        PyErr_Format(PyExc_TypeError, "message properties must be a dict, not %.100s",
                     Py_TYPE(mi->props)->tp_name);
        return -1;
    }
    Py_ssize_t at = 0;
    PyObject *name, *value;
    while (PyDict_Next(mi->props, &at, &name, &value)) {
        const char *p;
        Py_ssize_t nn, vn;
        if (str_utf8(name, &p, &nn) < 0 || str_utf8(value, &p, &vn) < 0) return -1;
        if (nn > (Py_ssize_t)U16_MAX || (uint64_t)vn > U32_MAX) {
            does_not_fit("a property name exceeds 65535 bytes or a value 4 GiB");
            return -1;
        }
        mi->props_len += 6 + (uint64_t)nn + (uint64_t)vn;
    }

    if ((v = field(m, M_BODY)) == NULL) return -1;
    int rc = PyObject_GetBuffer(v, &mi->body, PyBUF_SIMPLE);
    Py_DECREF(v);
    if (rc < 0) return -1;
    mi->has_body = 1;

    long long x;
    if ((uint64_t)mi->body.len > U32_MAX) {
        does_not_fit("a body exceeds 4 GiB");
        return -1;
    }
    if ((v = field(m, M_FLAG)) == NULL) return -1;
    rc = int_in(v, INT32_MIN, INT32_MAX, &x);
    Py_DECREF(v);
    if (rc < 0) {
        PyErr_Clear();
        does_not_fit("the flag is not a 32-bit signed int");
        return -1;
    }
    mi->flag = (int32_t)x;
    if ((v = field(m, M_BORN_MS)) == NULL) return -1;
    rc = int_in(v, INT64_MIN, INT64_MAX, &x);
    Py_DECREF(v);
    if (rc < 0) {
        PyErr_Clear();
        does_not_fit("the born timestamp is not a 64-bit signed int");
        return -1;
    }
    mi->born = x;
    if ((uint64_t)n_keys > U16_MAX || mi->keys_len > U32_MAX || mi->props_len > U32_MAX) {
        does_not_fit("more than 65535 keys, or keys or properties over 4 GiB");
        return -1;
    }
    mi->size = RECORD_HEAD_BYTES + (mi->tag_n < 0 ? 0 : (uint64_t)mi->tag_n) + mi->keys_len +
               mi->props_len + (uint64_t)mi->body.len;
    return 0;
}

static PyObject *changed(void)
{
    PyErr_SetString(PyExc_RuntimeError, "a message changed while its batch was encoded");
    return NULL;
}

/* A message's v3 record head at out (when not NULL), its born time a delta from born_base;
 * its length (the twin's _encode_v3 head). */
static int v3_head(const MsgInfo *mi, int64_t born_base, unsigned char *out)
{
    Py_ssize_t n_keys = PySequence_Fast_GET_SIZE(mi->keys);
    unsigned attrs = (mi->flag ? V3_FLAG : 0) | (mi->tag_n >= 0 ? V3_TAG : 0) |
                     (n_keys ? V3_KEYS : 0) | (mi->props_len ? V3_PROPS : 0);
    int n = 1;
    if (out != NULL) out[0] = (unsigned char)attrs;
#define PUT(v) n += put_uvarint(out != NULL ? out + n : NULL, (v))
    PUT(zigzag((int64_t)((uint64_t)mi->born - (uint64_t)born_base)));
    PUT((uint64_t)mi->body.len);
    if (attrs & V3_FLAG) PUT(zigzag(mi->flag));
    if (attrs & V3_TAG) PUT((uint64_t)mi->tag_n);
    if (attrs & V3_KEYS) {
        PUT((uint64_t)n_keys);
        PUT(mi->keys_len);
    }
    if (attrs & V3_PROPS) PUT(mi->props_len);
#undef PUT
    return n;
}

/* Pass two: one record at `out`, exactly mi->size bytes (re-walks the keys and properties, and
 * refuses if they no longer give the sizes pass one measured). */
static int write_record(const MsgInfo *mi, unsigned char *out, int version, int64_t born_base)
{
    unsigned char *p = out, *end = out + mi->size;
    Py_ssize_t n_keys = PySequence_Fast_GET_SIZE(mi->keys);
    if (version == OLDEST_VERSION) {
        wr32(p, (uint32_t)mi->body.len);
        wr32(p + 4, (uint32_t)mi->flag);
        wr64(p + 8, (uint64_t)mi->born);
        wr16(p + 16, mi->tag_n < 0 ? NO_TAG : (uint16_t)mi->tag_n);
        wr16(p + 18, (uint16_t)n_keys);
        wr32(p + 20, (uint32_t)mi->keys_len);
        wr32(p + 24, (uint32_t)mi->props_len);
        p += RECORD_HEAD_BYTES;
    } else {
        p += v3_head(mi, born_base, p);
    }
    if (mi->tag_n > 0) {
        memcpy(p, mi->tag_p, (size_t)mi->tag_n);
        p += mi->tag_n;
    }
    unsigned char *keys_end = p + mi->keys_len;
    for (Py_ssize_t i = 0; i < n_keys; i++) {
        const char *s;
        Py_ssize_t n;
        if (str_utf8(PySequence_Fast_GET_ITEM(mi->keys, i), &s, &n) < 0) return -1;
        if (n > (Py_ssize_t)U16_MAX || (uint64_t)(keys_end - p) < 2 + (uint64_t)n) {
            changed();
            return -1;
        }
        wr16(p, (uint16_t)n);
        memcpy(p + 2, s, (size_t)n);
        p += 2 + n;
    }
    if (p != keys_end) {
        changed();
        return -1;
    }
    unsigned char *props_end = p + mi->props_len;
    Py_ssize_t at = 0;
    PyObject *name, *value;
    while (PyDict_Next(mi->props, &at, &name, &value)) {
        const char *ns, *vs;
        Py_ssize_t nn, vn;
        if (str_utf8(name, &ns, &nn) < 0 || str_utf8(value, &vs, &vn) < 0) return -1;
        if (nn > (Py_ssize_t)U16_MAX ||
            (uint64_t)(props_end - p) < 6 + (uint64_t)nn + (uint64_t)vn) {
            changed();
            return -1;
        }
        wr16(p, (uint16_t)nn);
        wr32(p + 2, (uint32_t)vn);
        memcpy(p + 6, ns, (size_t)nn);
        memcpy(p + 6 + nn, vs, (size_t)vn);
        p += 6 + nn + vn;
    }
    if (p != props_end || (uint64_t)(end - p) != (uint64_t)mi->body.len) {
        changed();
        return -1;
    }
    memcpy(p, mi->body.buf, (size_t)mi->body.len);
    return 0;
}

static void release_infos(MsgInfo *infos, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(infos[i].tag);
        Py_XDECREF(infos[i].keys);
        Py_XDECREF(infos[i].props);
        if (infos[i].has_body) PyBuffer_Release(&infos[i].body);
    }
    PyMem_Free(infos);
}

/* What a batch's header says besides its messages (the twin's _Head): parsed and checked once. */
typedef struct {
    PyObject *empty, *pid, *seq_obj; /* owned, released by head_release */
    const char *topic_p, *host_p, *pid_p;
    Py_ssize_t topic_n, host_n, pid_n;
    uint16_t flags;
    uint64_t header_len;
    unsigned long long qid, base_seq;
    int version;
} Head;

static void head_release(Head *h)
{
    Py_XDECREF(h->empty);
    Py_XDECREF(h->pid);
    Py_XDECREF(h->seq_obj);
}

/* The twin's _Head.of: the version, the count's range, the strings and the producer, in its
 * order. `version` NULL: OLDEST_VERSION. */
static int head_parse(Head *h, PyObject *topic, Py_ssize_t n, PyObject *producer, PyObject *host,
                      PyObject *version)
{
    memset(h, 0, sizeof *h);
    h->version = OLDEST_VERSION;
    if (version != NULL) {
        long v = PyLong_CheckExact(version) ? PyLong_AsLong(version) : -1;
        if (v == -1 && PyErr_Occurred()) PyErr_Clear();
        if (v != 2 && v != 3) {
            PyErr_Format(PyExc_ValueError,
                         "stored batch version %S is not one this raftmq writes", version);
            return -1;
        }
        h->version = (int)v;
    }
    if (host == NULL && (host = h->empty = PyUnicode_FromStringAndSize("", 0)) == NULL) return -1;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "a stored batch carries at least one message");
        return -1;
    }
    if ((uint64_t)n > U32_MAX) {
        PyErr_Format(PyExc_ValueError, "%zd messages do not fit one batch", n);
        return -1;
    }
    if ((h->topic_p = short_utf8(topic, "topic", &h->topic_n)) == NULL) return -1;
    if ((h->host_p = short_utf8(host, "born host", &h->host_n)) == NULL) return -1;
    h->pid_p = "";
    if (producer != Py_None) {
        if ((h->pid = PyObject_GetAttrString(producer, "producer_id")) == NULL) return -1;
        if ((h->pid_p = short_utf8(h->pid, "producer id", &h->pid_n)) == NULL) return -1;
        if (h->pid_n == 0) {
            PyErr_SetString(PyExc_ValueError, "an idempotent producer's id is empty");
            return -1;
        }
        if ((h->seq_obj = PyObject_GetAttrString(producer, "first_sequence")) == NULL) return -1;
        h->flags = HAS_PRODUCER;
        PyObject *strict = PyObject_GetAttrString(producer, "strict");
        if (strict == NULL) return -1;
        int is_strict = PyObject_IsTrue(strict);
        Py_DECREF(strict);
        if (is_strict < 0) return -1;
        if (is_strict) h->flags |= STRICT_SEQUENCE;
    }
    uint64_t strings = (uint64_t)h->topic_n + (uint64_t)h->pid_n + (uint64_t)h->host_n;
    uint64_t fixed = h->version == OLDEST_VERSION ? FIXED_HEADER_BYTES : V3_HEADER_BYTES;
    h->header_len = (fixed + strings + 7) & ~(uint64_t)7;
    if (h->header_len > U16_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "topic, producer id and born host take %llu bytes; too long",
                     (unsigned long long)strings);
        return -1;
    }
    return 0;
}

/* The twin's _Head.join checks, once the records are measured: the total, the queue id and the
 * base sequence. */
static int head_check(Head *h, PyObject *queue_id, uint64_t total)
{
    if (total > U32_MAX) {
        PyErr_Format(PyExc_ValueError, "batch of %llu bytes exceeds the format's 4 GiB",
                     (unsigned long long)total);
        return -1;
    }
    int bad = !PyLong_Check(queue_id);
    h->qid = bad ? 0 : PyLong_AsUnsignedLongLong(queue_id);
    if (!bad && h->qid == (unsigned long long)-1 && PyErr_Occurred()) bad = 1;
    if (!bad && h->qid > U32_MAX) bad = 1;
    if (h->seq_obj != NULL) {
        if (!PyLong_Check(h->seq_obj)) {
            bad = 1;
        } else {
            h->base_seq = PyLong_AsUnsignedLongLong(h->seq_obj);
            if (h->base_seq == (unsigned long long)-1 && PyErr_Occurred()) bad = 1;
        }
    }
    if (bad) {
        PyErr_Clear();
        if (h->seq_obj != NULL)
            PyErr_Format(PyExc_ValueError, "queue id %R or base sequence %R out of range",
                         queue_id, h->seq_obj);
        else
            PyErr_Format(PyExc_ValueError, "queue id %R or base sequence 0 out of range",
                         queue_id);
        return -1;
    }
    return 0;
}

/* The header of a batch of `n` messages and `total` bytes into `out` (its body CRC left 0);
 * born_base: v3's. */
static void head_write(const Head *h, unsigned char *out, uint64_t total, uint32_t n,
                       uint16_t more_flags, int64_t born_base)
{
    memset(out, 0, (size_t)h->header_len);
    out[0] = KIND_PRODUCE;
    out[1] = (unsigned char)h->version;
    out[2] = STATE_PRODUCED;
    wr32(out + 4, (uint32_t)total);
    wr16(out + 32, (uint16_t)(h->flags | more_flags));
    wr16(out + 34, (uint16_t)h->header_len);
    wr32(out + 36, (uint32_t)h->qid);
    wr32(out + 40, n);
    wr64(out + 48, h->base_seq);
    wr16(out + 56, (uint16_t)h->topic_n);
    wr16(out + 58, (uint16_t)h->pid_n);
    wr16(out + 60, (uint16_t)h->host_n);
    unsigned char *at = out + FIXED_HEADER_BYTES;
    if (h->version != OLDEST_VERSION) {
        wr64(at, (uint64_t)born_base);
        at = out + V3_HEADER_BYTES;
    }
    memcpy(at, h->topic_p, (size_t)h->topic_n);
    memcpy(at + h->topic_n, h->pid_p, (size_t)h->pid_n);
    memcpy(at + h->topic_n + h->pid_n, h->host_p, (size_t)h->host_n);
}

/* The body CRC of a whole encoded batch, written in place; -1 with the error set. */
static int seal_body(unsigned char *out, uint64_t total)
{
    uint32_t crc;
    if (crc_of(out + BODY_AT, (Py_ssize_t)(total - BODY_AT), 0, &crc) < 0) return -1;
    wr32(out + BODY_CRC_AT, crc);
    return 0;
}

static PyObject *encode_batch(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"topic",     "queue_id", "messages", "producer",
                             "born_host", "version",  NULL};
    PyObject *topic, *queue_id, *messages, *producer = Py_None, *host = NULL, *version = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOO:encode_batch", kwlist, &topic,
                                     &queue_id, &messages, &producer, &host, &version))
        return NULL;
    PyObject *cache = NULL, *result = NULL, *fast = NULL;
    MsgInfo *infos = NULL;
    Py_ssize_t n = 0;
    Head h;
    memset(&h, 0, sizeof h);

    fast = PySequence_Fast(messages, "messages must be a sequence");
    if (fast == NULL) goto done;
    n = PySequence_Fast_GET_SIZE(fast);
    if (head_parse(&h, topic, n, producer, host, version) < 0) goto done;
    infos = PyMem_Calloc((size_t)n, sizeof(MsgInfo));
    if (infos == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *last_tag = NULL;
    uint64_t last_code = 0, pos = 0;
    uint16_t more_flags = 0;
    int any_tag = 0, v3 = h.version != OLDEST_VERSION;
    int64_t born_base = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (measure(items[i], topic, host != NULL ? host : h.empty, &infos[i], &cache, &last_tag,
                    &last_code) < 0)
            goto done;
        if (i == 0) born_base = infos[0].born;
        if (v3) /* measure counted v2's fixed head */
            infos[i].size += (uint64_t)v3_head(&infos[i], born_base, NULL) - RECORD_HEAD_BYTES;
        if (pos > U32_MAX) {
            does_not_fit("the messages exceed the offsets table's 4 GiB");
            goto done;
        }
        pos += infos[i].size;
        if (PySequence_Fast_GET_SIZE(infos[i].keys) > 0) more_flags |= HAS_KEYS;
        if (infos[i].tag_n >= 0) any_tag = 1;
    }
    int with_hashes = !v3 || any_tag;
    if (!with_hashes) more_flags |= NO_TAG_HASHES;
    uint64_t total = h.header_len + (with_hashes ? 12 : 4) * (uint64_t)n + pos;
    if (head_check(&h, queue_id, total) < 0) goto done;

    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    head_write(&h, out, total, (uint32_t)n, more_flags, born_base);
    unsigned char *hashes = out + h.header_len;
    unsigned char *offsets = hashes + (with_hashes ? 8 * (uint64_t)n : 0);
    unsigned char *records = offsets + 4 * (uint64_t)n;
    pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (with_hashes) wr64(hashes + 8 * i, infos[i].code);
        wr32(offsets + 4 * i, (uint32_t)pos);
        if (write_record(&infos[i], records + pos, h.version, born_base) < 0) {
            Py_CLEAR(result);
            goto done;
        }
        pos += infos[i].size;
    }
    if (seal_body(out, total) < 0) Py_CLEAR(result);
done:
    if (infos != NULL) release_infos(infos, n);
    Py_XDECREF(fast);
    Py_XDECREF(cache);
    head_release(&h);
    return result;
}

/* ---- bodies as an Arrow column (the twin's BodyColumn) ---------------------------------------- */

static PyObject *BodyColumnType; /* the twin's dataclass */

/* One run of encode_bodies: a PySequence_Fast of bytes, or a body column's buffers and rows. */
typedef struct {
    PyObject *fast;
    Py_buffer offs, data;
    int has_offs, has_data;
    Py_ssize_t start, step, count; /* the column's rows */
    Py_ssize_t n_offs;
} Run;

static void run_release(Run *r)
{
    Py_XDECREF(r->fast);
    if (r->has_offs) PyBuffer_Release(&r->offs);
    if (r->has_data) PyBuffer_Release(&r->data);
    r->fast = NULL;
    r->has_offs = r->has_data = 0;
}

/* The twin's _column_rows: a BodyColumn's rows, an ascending range from 0 on. */
static int column_rows(PyObject *col, Run *r)
{
    PyObject *rows = PyObject_GetAttrString(col, "rows");
    if (rows == NULL) return -1;
    int ok = Py_IS_TYPE(rows, &PyRange_Type);
    Py_ssize_t v[3] = {0, 0, 0};
    static const char *names[3] = {"start", "step", "stop"};
    for (int i = 0; ok && i < 3; i++) {
        PyObject *x = PyObject_GetAttrString(rows, names[i]);
        if (x == NULL) {
            Py_DECREF(rows);
            return -1;
        }
        v[i] = PyLong_AsSsize_t(x);
        Py_DECREF(x);
        if (v[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(rows);
            return -1;
        }
    }
    Py_ssize_t count = ok ? PyObject_Size(rows) : 0;
    if (count < 0) {
        Py_DECREF(rows);
        return -1;
    }
    if (!ok || v[1] < 1 || (count > 0 && v[0] < 0)) {
        PyErr_Format(PyExc_ValueError,
                     "a body column's rows must be an ascending range from 0 on, not %R", rows);
        Py_DECREF(rows);
        return -1;
    }
    Py_DECREF(rows);
    r->start = v[0];
    r->step = v[1];
    r->count = count;
    return 0;
}

/* The twin's _column_buffers: the offsets (a whole number of int32) and the data, and the last
 * row within the offsets. */
static int column_buffers(PyObject *col, Run *r)
{
    PyObject *o = PyObject_GetAttrString(col, "offsets");
    if (o == NULL) return -1;
    int rc = PyObject_GetBuffer(o, &r->offs, PyBUF_SIMPLE);
    Py_DECREF(o);
    if (rc < 0) return -1;
    r->has_offs = 1;
    if (r->offs.len % 4) {
        PyErr_Format(PyExc_ValueError,
                     "a body column's offsets take %zd bytes, not a multiple of 4", r->offs.len);
        return -1;
    }
    r->n_offs = r->offs.len / 4;
    if (r->count > 0) {
        Py_ssize_t last = r->start + (r->count - 1) * r->step;
        if (last + 1 >= r->n_offs) {
            PyErr_Format(PyExc_ValueError, "a body column's row %zd is past its %zd offsets",
                         last, r->n_offs);
            return -1;
        }
    }
    PyObject *d = PyObject_GetAttrString(col, "data");
    if (d == NULL) return -1;
    rc = PyObject_GetBuffer(d, &r->data, PyBUF_SIMPLE);
    Py_DECREF(d);
    if (rc < 0) return -1;
    r->has_data = 1;
    return 0;
}

/* The twin's _column_body: row's body [*start, *end) within the data. */
static inline int column_body(const Run *r, Py_ssize_t row, int32_t *start, int32_t *end)
{
    const unsigned char *o = (const unsigned char *)r->offs.buf;
    *start = (int32_t)rd32(o + 4 * row);
    *end = (int32_t)rd32(o + 4 * (row + 1));
    if (*start < 0 || *start > *end || (Py_ssize_t)*end > r->data.len) {
        PyErr_Format(PyExc_ValueError, "a body column's row %zd spans %d..%d, outside its %zd bytes",
                     row, (int)*start, (int)*end, r->data.len);
        return -1;
    }
    return 0;
}

static PyObject *body_sizes(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (!((nargs == 1 && nkw == 0) ||
          (nargs == 0 && nkw == 1 &&
           PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "column") == 0))) {
        PyErr_SetString(PyExc_TypeError, "body_sizes() takes exactly one argument, column");
        return NULL;
    }
    Run r;
    memset(&r, 0, sizeof r);
    PyObject *out = NULL;
    if (column_rows(args[0], &r) < 0 || column_buffers(args[0], &r) < 0) goto done;
    long long total = 0, smallest = -1, biggest = 0;
    for (Py_ssize_t k = 0, row = r.start; k < r.count; k++, row += r.step) {
        int32_t a, b;
        if (column_body(&r, row, &a, &b) < 0) goto done;
        long long n = (long long)b - a;
        total += n;
        if (smallest < 0 || n < smallest) smallest = n;
        if (n > biggest) biggest = n;
    }
    out = Py_BuildValue("(LLL)", total, smallest < 0 ? 0LL : smallest, biggest);
done:
    run_release(&r);
    return out;
}

/* encode_batch of messages without tag, keys or properties, from (born ms, bodies) runs, bodies
 * bytes or a body column: per message a record head and one copy of the body (the batch-first
 * call, issue 24; the Spark sink's columns, issue 28). */
static PyObject *encode_bodies(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"topic",     "queue_id", "runs", "producer",
                             "born_host", "version",  NULL};
    PyObject *topic, *queue_id, *runs, *producer = Py_None, *host = NULL, *version = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOO:encode_bodies", kwlist, &topic,
                                     &queue_id, &runs, &producer, &host, &version))
        return NULL;
    PyObject *fast = NULL, *result = NULL;
    Run *bodies = NULL; /* each run's bodies */
    int64_t *born = NULL;
    Py_ssize_t n_runs = 0, n = 0;
    Head h;
    memset(&h, 0, sizeof h);

    fast = PySequence_Fast(runs, "runs must be a sequence");
    if (fast == NULL) goto done;
    n_runs = PySequence_Fast_GET_SIZE(fast);
    bodies = PyMem_Calloc((size_t)(n_runs ? n_runs : 1), sizeof(Run));
    born = PyMem_Calloc((size_t)(n_runs ? n_runs : 1), sizeof(int64_t));
    if (bodies == NULL || born == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        PyObject *run = PySequence_Fast_GET_ITEM(fast, r);
        if (!PyTuple_CheckExact(run) || PyTuple_GET_SIZE(run) != 2) {
            PyErr_SetString(PyExc_TypeError, "each run must be a (born ms, bodies) tuple");
            goto done;
        }
        PyObject *b = PyTuple_GET_ITEM(run, 1);
        int is_col = PyObject_IsInstance(b, BodyColumnType);
        if (is_col < 0) goto done;
        if (is_col) {
            if (column_rows(b, &bodies[r]) < 0) goto done;
            n += bodies[r].count;
            continue;
        }
        bodies[r].fast = PySequence_Fast(b, "a run's bodies must be a sequence");
        if (bodies[r].fast == NULL) goto done;
        n += PySequence_Fast_GET_SIZE(bodies[r].fast);
    }
    if (head_parse(&h, topic, n, producer, host, version) < 0) goto done;
    int v3 = h.version != OLDEST_VERSION;
    int64_t born_base = 0; /* the first message's born time, as encode_batch takes it */
    int have_base = 0;
    uint64_t pos = 0;
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        PyObject *run = PySequence_Fast_GET_ITEM(fast, r);
        PyObject *ms = PyTuple_GET_ITEM(run, 0);
        int overflow = 0;
        long long v = PyLong_Check(ms) ? PyLong_AsLongLongAndOverflow(ms, &overflow) : 0;
        if (!PyLong_Check(ms) || overflow) {
            does_not_fit("a born timestamp is not a 64-bit integer");
            goto done;
        }
        born[r] = (int64_t)v;
        Run *b = &bodies[r];
        Py_ssize_t run_n = b->fast != NULL ? PySequence_Fast_GET_SIZE(b->fast) : b->count;
        if (!have_base && run_n > 0) {
            born_base = born[r];
            have_base = 1;
        }
        /* v3: attributes 0 and the run's born delta, shared by its heads, then the length */
        uint64_t prefix =
            v3 ? 1 + (uint64_t)put_uvarint(
                         NULL, zigzag((int64_t)((uint64_t)born[r] - (uint64_t)born_base)))
               : 0;
        if (b->fast == NULL) {
            if (column_buffers(PyTuple_GET_ITEM(run, 1), b) < 0) goto done;
            for (Py_ssize_t k = 0, row = b->start; k < b->count; k++, row += b->step) {
                int32_t s, e;
                if (column_body(b, row, &s, &e) < 0) goto done;
                uint64_t len = (uint64_t)(e - s);
                pos += (v3 ? prefix + (uint64_t)put_uvarint(NULL, len) : RECORD_HEAD_BYTES) + len;
            }
            continue;
        }
        PyObject **items = PySequence_Fast_ITEMS(b->fast);
        for (Py_ssize_t i = 0, k = PySequence_Fast_GET_SIZE(b->fast); i < k; i++) {
            if (!PyBytes_Check(items[i])) {
                PyErr_Format(PyExc_TypeError, "a body must be bytes, not %.100s",
                             Py_TYPE(items[i])->tp_name);
                goto done;
            }
            uint64_t len = (uint64_t)PyBytes_GET_SIZE(items[i]);
            if (len > U32_MAX) {
                does_not_fit("a body exceeds 4 GiB");
                goto done;
            }
            pos += (v3 ? prefix + (uint64_t)put_uvarint(NULL, len) : RECORD_HEAD_BYTES) + len;
        }
    }
    /* v3 leaves the tag-hash table out (no tag here); v2 has it, all 0 */
    uint64_t hashes_len = v3 ? 0 : 8 * (uint64_t)n;
    uint64_t total = h.header_len + hashes_len + 4 * (uint64_t)n + pos, records_bytes = pos;
    if (head_check(&h, queue_id, total) < 0) goto done;

    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    head_write(&h, out, total, (uint32_t)n, v3 ? NO_TAG_HASHES : 0, born_base);
    unsigned char *hashes = out + h.header_len, *offsets = hashes + hashes_len;
    unsigned char *records = offsets + 4 * (uint64_t)n;
    memset(hashes, 0, (size_t)hashes_len); /* no tag: hash 0, as encode_batch gives */
    pos = 0;
    Py_ssize_t m = 0;
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        Run *b = &bodies[r];
        Py_ssize_t k = b->fast != NULL ? PySequence_Fast_GET_SIZE(b->fast) : b->count;
        PyObject **items = b->fast != NULL ? PySequence_Fast_ITEMS(b->fast) : NULL;
        const unsigned char *data = (const unsigned char *)b->data.buf;
        unsigned char prefix[11];
        int prefix_n = 0;
        if (v3) {
            prefix[0] = 0;
            prefix_n = 1 + put_uvarint(
                               prefix + 1, zigzag((int64_t)((uint64_t)born[r] - (uint64_t)born_base)));
        }
        for (Py_ssize_t i = 0, row = b->start; i < k; i++, m++, row += b->step) {
            const unsigned char *body;
            Py_ssize_t len;
            if (items != NULL) {
                len = PyBytes_GET_SIZE(items[i]);
                body = (const unsigned char *)PyBytes_AS_STRING(items[i]);
            } else { /* checked again: a writable buffer may have changed since */
                int32_t s = 0, e = 0;
                uint64_t need = 0;
                if (column_body(b, row, &s, &e) == 0) {
                    uint64_t blen = (uint64_t)(e - s);
                    need = (v3 ? (uint64_t)prefix_n + (uint64_t)put_uvarint(NULL, blen)
                               : RECORD_HEAD_BYTES) +
                           blen;
                }
                if (PyErr_Occurred() || pos + need > records_bytes) {
                    if (!PyErr_Occurred()) changed();
                    Py_CLEAR(result);
                    goto done;
                }
                len = (Py_ssize_t)(e - s);
                body = data + s;
            }
            unsigned char *rec = records + pos;
            wr32(offsets + 4 * m, (uint32_t)pos);
            if (v3) {
                memcpy(rec, prefix, (size_t)prefix_n);
                int head_n = prefix_n + put_uvarint(rec + prefix_n, (uint64_t)len);
                memcpy(rec + head_n, body, (size_t)len);
                pos += (uint64_t)head_n + (uint64_t)len;
                continue;
            }
            wr32(rec, (uint32_t)len);         /* body length */
            wr32(rec + 4, 0);                 /* flag */
            wr64(rec + 8, (uint64_t)born[r]); /* born timestamp ms */
            wr16(rec + 16, NO_TAG);
            wr16(rec + 18, 0); /* key count */
            wr32(rec + 20, 0); /* keys length */
            wr32(rec + 24, 0); /* properties length */
            memcpy(rec + RECORD_HEAD_BYTES, body, (size_t)len);
            pos += RECORD_HEAD_BYTES + (uint64_t)len;
        }
    }
    if (seal_body(out, total) < 0) Py_CLEAR(result);
done:
    if (bodies != NULL) {
        for (Py_ssize_t r = 0; r < n_runs; r++) run_release(&bodies[r]);
        PyMem_Free(bodies);
    }
    PyMem_Free(born);
    Py_XDECREF(fast);
    head_release(&h);
    return result;
}

/* ---- whole-batch checks ---------------------------------------------------------------------- */

#define CHECK_NONE (-1) /* stamped=None: no CRC */

static PyObject *decode_header_str(const unsigned char *p, Py_ssize_t n)
{
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        malformed("invalid utf-8 in the batch header: %S", value);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    return s;
}

/* The twin's _parse over a buffer of `size` bytes: stamped is 1/0 (check the CRCs of a
 * stamped/unstamped batch) or CHECK_NONE; table says whether to check the offsets table. */
static PyObject *parse(const unsigned char *mv, Py_ssize_t size, int stamped, int table)
{
    if (size < FIXED_HEADER_BYTES)
        return malformed("batch of %zd bytes is shorter than its %d-byte header", size,
                         FIXED_HEADER_BYTES);
    unsigned kind = mv[0], version = mv[1], state = mv[2], reserved0 = mv[3];
    uint32_t total = rd32(mv + 4), stamp_crc_v = rd32(mv + 8), body_crc = rd32(mv + 12);
    uint64_t base = rd64(mv + 16);
    int64_t store_ms = (int64_t)rd64(mv + 24);
    unsigned flags = rd16(mv + 32), header_len = rd16(mv + 34);
    uint32_t queue_id = rd32(mv + 36), count = rd32(mv + 40), reserved1 = rd32(mv + 44);
    uint64_t base_seq = rd64(mv + 48);
    unsigned topic_len = rd16(mv + 56), pid_len = rd16(mv + 58), host_len = rd16(mv + 60);
    unsigned reserved2 = rd16(mv + 62);
    char a[11], b[11];
    uint32_t crc;

    if (kind != KIND_PRODUCE)
        return malformed("kind %u is not a produce batch (%d)", kind, KIND_PRODUCE);
    if (version > VERSION)
        return unsupported("stored batch version %u is newer than this raftmq reads (%d); "
                           "upgrade raftmq where the batch is read", version, VERSION);
    if (version < OLDEST_VERSION)
        return malformed("stored batch version %u is not supported (%d..%d)", version,
                         OLDEST_VERSION, VERSION);
    unsigned strings_at = FIXED_HEADER_BYTES, known = KNOWN_FLAGS;
    int64_t min_record = RECORD_HEAD_BYTES;
    if (version == 3) {
        strings_at = V3_HEADER_BYTES;
        known = KNOWN_FLAGS_V3;
        min_record = V3_MIN_RECORD;
        if (size < V3_HEADER_BYTES)
            return malformed("batch of %zd bytes is shorter than its %d-byte header", size,
                             V3_HEADER_BYTES);
    }
    if ((Py_ssize_t)total != size)
        return malformed("total length %u but the batch has %zd bytes", (unsigned)total, size);
    if (state == STATE_PRODUCED) {
        if (stamped == 1) return malformed("state: the batch was never stamped");
        static const unsigned char zeros[BODY_AT] = {0};
        if (memcmp(mv + STAMP_CRC_AT, zeros, 4) != 0 ||
            memcmp(mv + STAMP_AT, zeros, BODY_AT - STAMP_AT) != 0)
            return malformed("stamp slots of an unstamped batch are not zero");
    } else if (state == STATE_STAMPED || state == STATE_PLACED) {
        if (stamped == 0) return malformed("state: the batch is already stamped");
        if (stamped == 1) {
            if (stamp_crc(mv, &crc) < 0) return NULL;
            if (crc != stamp_crc_v) {
                hex32(a, stamp_crc_v);
                hex32(b, crc);
                return malformed("stamp CRC mismatch: header says %s, bytes give %s", a, b);
            }
        }
    } else {
        return malformed("unknown state %u", state);
    }
    if (stamped != CHECK_NONE) {
        if (crc_of(mv + BODY_AT, size - BODY_AT, 0, &crc) < 0) return NULL;
        if (crc != body_crc) {
            hex32(a, body_crc);
            hex32(b, crc);
            return malformed("body CRC mismatch: header says %s, bytes give %s", a, b);
        }
    }
    if (reserved0 || reserved1 || reserved2)
        return malformed("reserved header fields are not zero");
    if (flags & ~known)
        return unsupported("stored batch flags 0x%x include 0x%x, unknown to this raftmq "
                           "(it reads 0x%x); upgrade raftmq where the batch is read",
                           flags, flags & ~known, known);
    int has_producer = (flags & HAS_PRODUCER) != 0;
    if (has_producer != (pid_len > 0) || (!has_producer && (base_seq || flags & STRICT_SEQUENCE)))
        return malformed("producer flag, producer id length and base sequence disagree");
    unsigned strings_end = strings_at + topic_len + pid_len + host_len;
    if (header_len != ((strings_end + 7) & ~7u))
        return malformed("header length %u does not match its strings (%u bytes)", header_len,
                         strings_end);
    if (count == 0) return malformed("message count is 0");
    int64_t records_at =
        (int64_t)header_len + ((flags & NO_TAG_HASHES) ? 4 : 12) * (int64_t)count;
    int64_t area = (int64_t)size - records_at;
    if (area < (int64_t)count * min_record)
        return malformed(
            "message count %u does not fit a %zd-byte batch with header length %u",
            (unsigned)count, size, header_len);
    for (unsigned i = strings_end; i < header_len; i++) {
        if (mv[i]) return malformed("header padding is not zero");
    }
    PyObject *v[H_N] = {NULL};
    const unsigned char *at = mv + strings_at;
    if ((v[H_TOPIC] = decode_header_str(at, topic_len)) == NULL) goto fail;
    at += topic_len;
    if (has_producer) {
        PyObject *pv[P_N] = {decode_header_str(at, pid_len), NULL, NULL};
        if (pv[0] == NULL) goto fail;
        pv[1] = PyLong_FromUnsignedLongLong(base_seq);
        pv[2] = Py_NewRef((flags & STRICT_SEQUENCE) ? Py_True : Py_False);
        if ((v[H_PRODUCER] = fill(ProducerSequenceType, ProducerSlots, pv, P_N)) == NULL)
            goto fail;
    } else {
        v[H_PRODUCER] = Py_NewRef(Py_None);
    }
    at += pid_len;
    if ((v[H_BORN_HOST] = decode_header_str(at, host_len)) == NULL) goto fail;
    if (table) {
        const unsigned char *offs = mv + records_at - 4 * (int64_t)count;
        uint32_t first = rd32(offs);
        if (first != 0) {
            malformed("message offsets: the first is %u, not 0", (unsigned)first);
            goto fail;
        }
        uint32_t prev = 0;
        int increasing = 1;
        for (uint32_t i = 1; i < count && increasing; i++) {
            uint32_t o = rd32(offs + 4 * (size_t)i);
            increasing = o >= prev;
            prev = o;
        }
        uint32_t last = rd32(offs + 4 * ((size_t)count - 1));
        if ((int64_t)last > area - min_record || !increasing) {
            malformed("message offsets are not increasing or overrun the batch's message area");
            goto fail;
        }
    }
    v[H_QUEUE_ID] = PyLong_FromUnsignedLong(queue_id);
    v[H_COUNT] = PyLong_FromUnsignedLong(count);
    v[H_STAMPED] = Py_NewRef(state != STATE_PRODUCED ? Py_True : Py_False);
    v[H_BASE_OFFSET] = PyLong_FromUnsignedLongLong(base);
    v[H_STORE_MS] = PyLong_FromLongLong(store_ms);
    v[H_TOTAL_BYTES] = PyLong_FromSsize_t(size);
    v[H_TABLES_AT] = PyLong_FromUnsignedLong(header_len);
    v[H_RECORDS_AT] = PyLong_FromLongLong(records_at);
    v[H_VERSION] = PyLong_FromLong((long)version);
    v[H_BORN_BASE] = PyLong_FromLongLong(version == 3 ? (int64_t)rd64(mv + FIXED_HEADER_BYTES) : 0);
    return fill(BatchHeaderType, HeaderSlots, v, H_N);
fail:
    for (int i = 0; i < H_N; i++) Py_XDECREF(v[i]);
    return NULL;
}

static PyObject *parse_obj(PyObject *buf, int stamped, int table)
{
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *h = parse(view.buf, view.len, stamped, table);
    PyBuffer_Release(&view);
    return h;
}

static int limit_of(PyObject *limits, const char *name, long long *out)
{
    PyObject *v = PyObject_GetAttrString(limits, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *check_batch(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "limits", NULL};
    PyObject *buf, *limits = DefaultLimits;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:check_batch", kwlist, &buf, &limits))
        return NULL;
    long long max_bytes, max_messages;
    if (limit_of(limits, "max_batch_bytes", &max_bytes) < 0 ||
        limit_of(limits, "max_messages", &max_messages) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *h = NULL;
    if ((long long)view.len > max_bytes) {
        malformed("batch of %zd bytes exceeds max_batch_bytes %lld", view.len, max_bytes);
    } else if ((h = parse(view.buf, view.len, 0, 1)) != NULL) {
        long long count = rd32((const unsigned char *)view.buf + COUNT_AT);
        if (count > max_messages) {
            Py_CLEAR(h);
            malformed("batch of %lld messages exceeds max_messages %lld", count, max_messages);
        }
    }
    PyBuffer_Release(&view);
    return h;
}

/* The one argument `buf` of a METH_FASTCALL | METH_KEYWORDS function, positional or by name
 * (as the twin's signature takes it), without PyArg_ParseTupleAndKeywords's cost. */
static PyObject *buf_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                         const char *fname)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs == 1 && nkw == 0) return args[0];
    if (nargs == 0 && nkw == 1 &&
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "buf") == 0)
        return args[0];
    PyErr_Format(PyExc_TypeError, "%s() takes exactly one argument, buf", fname);
    return NULL;
}

static PyObject *verify_stamped(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    PyObject *buf = buf_arg(args, nargs, kwnames, "verify_stamped");
    return buf == NULL ? NULL : parse_obj(buf, 1, 1);
}

static PyObject *read_header(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    PyObject *buf = buf_arg(args, nargs, kwnames, "read_header");
    return buf == NULL ? NULL : parse_obj(buf, CHECK_NONE, 0);
}

static PyObject *stamp(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "base_offset", "store_ms", NULL};
    PyObject *buf, *base_obj, *ms_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:stamp", kwlist, &buf, &base_obj, &ms_obj))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) return NULL;
    int ok = view.len >= FIXED_HEADER_BYTES &&
             ((const unsigned char *)view.buf)[STATE_AT] == STATE_PRODUCED;
    PyBuffer_Release(&view);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "stamp() takes an unstamped batch that check_batch accepted");
        return NULL;
    }
    if (!PyLong_Check(base_obj) || !PyLong_Check(ms_obj)) {
        PyErr_SetString(PyExc_TypeError, "stamp() takes an int base offset and store time");
        return NULL;
    }
    unsigned long long base = PyLong_AsUnsignedLongLong(base_obj);
    int overflow = 0;
    long long ms = PyLong_AsLongLongAndOverflow(ms_obj, &overflow);
    if ((base == (unsigned long long)-1 && PyErr_Occurred()) || overflow ||
        (ms == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "base offset %R or store time %R out of range", base_obj,
                     ms_obj);
        return NULL;
    }
    if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) { /* as the twin's pack_into */
            PyErr_Format(PyExc_TypeError,
                         "argument must be read-write bytes-like object, not %.100s",
                         Py_TYPE(buf)->tp_name);
        }
        return NULL;
    }
    unsigned char *p = view.buf;
    PyObject *result = NULL;
    uint32_t crc;
    if (view.len < FIXED_HEADER_BYTES) { /* resized by another thread meanwhile */
        PyErr_SetString(PyExc_ValueError, "stamp() takes an unstamped batch");
    } else {
        wr64(p + STAMP_AT, base);
        wr64(p + STAMP_AT + 8, (uint64_t)ms);
        p[STATE_AT] = STATE_STAMPED;
        if (stamp_crc(p, &crc) == 0) {
            wr32(p + STAMP_CRC_AT, crc);
            result = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&view);
    return result;
}

/* ---- per-batch reads for the index and pulls ------------------------------------------------- */

static PyObject *batch_count(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    PyObject *buf = buf_arg(args, nargs, kwnames, "batch_count");
    if (buf == NULL) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *r;
    if (view.len < FIXED_HEADER_BYTES)
        r = malformed("batch of %zd bytes is shorter than its header", view.len);
    else
        r = PyLong_FromUnsignedLong(rd32((const unsigned char *)view.buf + COUNT_AT));
    PyBuffer_Release(&view);
    return r;
}

/* The header given, else read_header(buf) (new reference). */
static PyObject *header_or_read(PyObject *buf, PyObject *header)
{
    if (header != NULL && header != Py_None) return Py_NewRef(header);
    return parse_obj(buf, CHECK_NONE, 0);
}

static int header_int(PyObject *h, const char *name, long long *out)
{
    PyObject *v = PyObject_GetAttrString(h, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* memoryview(buf).cast("B")[start:stop], cast to `format` unless NULL. */
static PyObject *view_of(PyObject *buf, long long start, long long stop, const char *format)
{
    PyObject *mv = PyMemoryView_FromObject(buf), *bytes_mv = NULL, *sl = NULL, *r = NULL;
    if (mv == NULL) return NULL;
    bytes_mv = PyObject_CallMethod(mv, "cast", "s", "B");
    Py_DECREF(mv);
    if (bytes_mv == NULL) return NULL;
    sl = PySequence_GetSlice(bytes_mv, (Py_ssize_t)start, (Py_ssize_t)stop);
    Py_DECREF(bytes_mv);
    if (sl == NULL || format == NULL) return sl;
    r = PyObject_CallMethod(sl, "cast", "s", format);
    Py_DECREF(sl);
    return r;
}

static PyObject *table_view(PyObject *args, PyObject *kwargs, const char *name, int hashes)
{
    static char *kwlist[] = {"buf", "header", NULL};
    PyObject *buf, *header = Py_None;
    char fmt[32];
    snprintf(fmt, sizeof fmt, "O|O:%s", name);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kwlist, &buf, &header)) return NULL;
    PyObject *h = header_or_read(buf, header);
    if (h == NULL) return NULL;
    long long tables_at, count, records_at;
    PyObject *r = NULL;
    if (header_int(h, "tables_at", &tables_at) == 0 && header_int(h, "count", &count) == 0 &&
        header_int(h, "records_at", &records_at) == 0) {
        if (hashes && records_at - tables_at != 12 * count) { /* no table: every hash 0 */
            PyObject *zeros = PyObject_CallFunction((PyObject *)&PyBytes_Type, "L", 8 * count);
            if (zeros != NULL) {
                r = view_of(zeros, 0, 8 * count, "Q");
                Py_DECREF(zeros);
            }
        } else if (hashes) {
            r = view_of(buf, tables_at, tables_at + 8 * count, "Q");
        } else {
            r = view_of(buf, records_at - 4 * count, records_at, "I");
        }
    }
    Py_DECREF(h);
    return r;
}

static PyObject *tag_hashes(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return table_view(args, kwargs, "tag_hashes", 1);
}

static PyObject *message_offsets(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return table_view(args, kwargs, "message_offsets", 0);
}

static PyObject *slice_from(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "k", "header", NULL};
    PyObject *buf, *k_obj, *header = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:slice_from", kwlist, &buf, &k_obj,
                                     &header))
        return NULL;
    PyObject *h = header_or_read(buf, header), *r = NULL;
    if (h == NULL) return NULL;
    long long tables_at, count, records_at, total;
    if (header_int(h, "tables_at", &tables_at) < 0 || header_int(h, "count", &count) < 0 ||
        header_int(h, "records_at", &records_at) < 0 || header_int(h, "total_bytes", &total) < 0)
        goto done;
    int overflow = 0;
    long long k = PyLong_Check(k_obj) ? PyLong_AsLongLongAndOverflow(k_obj, &overflow) : -1;
    if (PyErr_Occurred()) goto done;
    if (!PyLong_Check(k_obj) || overflow || k < 0 || k >= count) {
        PyErr_Format(PyExc_ValueError, "message %R is not in a batch of %lld", k_obj, count);
        goto done;
    }
    long long at = records_at - 4 * (count - k);
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) goto done;
    if (at < 0 || at + 4 > view.len) {
        PyBuffer_Release(&view);
        malformed("the header does not describe this batch: offset %lld outside it", at);
        goto done;
    }
    long long start = records_at + rd32((const unsigned char *)view.buf + at);
    PyBuffer_Release(&view);
    r = view_of(buf, start, total, NULL);
done:
    Py_DECREF(h);
    return r;
}

/* ---- lazy client decoding -------------------------------------------------------------------- */

/* The head of the record at d[pos:end] checked against the span (the twin's _record_head):
 * 0, or -1 with the twin's MalformedBatchError naming `offset`. */
static int checked_head(const unsigned char *d, int64_t pos, int64_t end, int version,
                        int64_t born_base, PyObject *offset, RecHead *h, int64_t *at)
{
    int rc = read_head(d, pos, end, version, born_base, h, at);
    if (rc == HEAD_OVERRUN) {
        malformed("record of message at queue offset %S is too short", offset);
        return -1;
    }
    if (rc == HEAD_BAD) {
        malformed("record of message at queue offset %S: its head is malformed", offset);
        return -1;
    }
    int64_t size = record_size(h, pos, *at);
    if (pos + size != end) {
        malformed("record of message at queue offset %S: its lengths give %lld bytes, the "
                  "offsets table %lld",
                  offset, (long long)size, (long long)(end - pos));
        return -1;
    }
    return 0;
}

/* One BatchMessage over data[pos:end] (the twin's _make): the record head checked against the
 * span; its fields decoded on access by the twin's properties. */
static PyObject *make_message(PyObject *header, PyObject *data, int64_t pos, int64_t end,
                              PyObject *offset, uint64_t code, int version, int64_t born_base)
{
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    RecHead rh;
    int64_t at;
    if (checked_head(d, pos, end, version, born_base, offset, &rh, &at) < 0) {
        Py_DECREF(offset);
        return NULL;
    }
    PyObject *head = PyTuple_New(7);
    if (head == NULL) {
        Py_DECREF(offset);
        return NULL;
    }
    PyObject *items[7] = {
        PyLong_FromUnsignedLong(rh.body_len),
        PyLong_FromLong(rh.flag),
        PyLong_FromLongLong(rh.born),
        PyLong_FromUnsignedLong(rh.tag_len),
        PyLong_FromUnsignedLong(rh.n_keys),
        PyLong_FromUnsignedLong(rh.keys_len),
        PyLong_FromUnsignedLong(rh.props_len),
    };
    for (int i = 0; i < 7; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 7; j++) Py_XDECREF(items[j]);
            Py_DECREF(head);
            Py_DECREF(offset);
            return NULL;
        }
        PyTuple_SET_ITEM(head, i, items[i]);
    }
    PyObject *v[B_N];
    v[B_BATCH] = Py_NewRef(header);
    v[B_DATA] = Py_NewRef(data);
    v[B_END] = PyLong_FromLongLong(end);
    v[B_HEAD] = head;
    v[B_POS] = PyLong_FromLongLong(at);
    v[B_QUEUE_OFFSET] = offset;
    v[B_TAG_HASH] = PyLong_FromUnsignedLongLong(code);
    return fill(BatchMessageType, MessageSlots, v, B_N);
}

/* Queue offsets base + i: in C while they fit an int64, else Python ints. */
typedef struct {
    PyObject *base; /* header.base_offset + first */
    int64_t fast;   /* its value when fits */
    int fits;
} Offsets;

static int offsets_init(Offsets *o, PyObject *header, PyObject *first, int64_t span)
{
    PyObject *base = PyObject_GetAttrString(header, "base_offset");
    if (base == NULL) return -1;
    o->base = PyNumber_Add(base, first);
    Py_DECREF(base);
    if (o->base == NULL) return -1;
    int overflow = 0;
    long long v = PyLong_Check(o->base) ? PyLong_AsLongLongAndOverflow(o->base, &overflow) : 0;
    if (v == -1 && PyErr_Occurred()) return -1;
    o->fits = PyLong_Check(o->base) && !overflow && v >= 0 && v <= INT64_MAX - span;
    o->fast = v;
    return 0;
}

static PyObject *offsets_at(Offsets *o, int64_t i)
{
    if (o->fits) return PyLong_FromLongLong(o->fast + i);
    PyObject *d = PyLong_FromLongLong(i);
    if (d == NULL) return NULL;
    PyObject *r = PyNumber_Add(o->base, d);
    Py_DECREF(d);
    return r;
}

typedef struct {
    PyObject_HEAD
    PyObject *header;
    PyObject *data; /* bytes */
    Offsets offsets;
    int64_t tables_at, records_at, total, count, next, born_base;
    int version, has_hashes;
} MessageIter;

static void message_iter_dealloc(MessageIter *it)
{
    PyObject_GC_UnTrack(it);
    Py_XDECREF(it->header);
    Py_XDECREF(it->data);
    Py_XDECREF(it->offsets.base);
    PyObject_GC_Del(it);
}

static int message_iter_traverse(MessageIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->header);
    Py_VISIT(it->data);
    Py_VISIT(it->offsets.base);
    return 0;
}

static PyObject *message_iter_next(MessageIter *it)
{
    if (it->next >= it->count) return NULL;
    int64_t i = it->next++;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(it->data);
    const unsigned char *offs = d + it->records_at - 4 * it->count;
    int64_t start = it->records_at + rd32(offs + 4 * i);
    int64_t stop = i + 1 < it->count ? it->records_at + rd32(offs + 4 * (i + 1)) : it->total;
    PyObject *offset = offsets_at(&it->offsets, i);
    if (offset == NULL) return NULL;
    return make_message(it->header, it->data, start, stop, offset,
                        it->has_hashes ? rd64(d + it->tables_at + 8 * i) : 0, it->version,
                        it->born_base);
}

static PyTypeObject MessageIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "raftmq.common._stored_batch_c.MessageIter",
    .tp_basicsize = sizeof(MessageIter),
    .tp_dealloc = (destructor)message_iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The messages of a stored batch, made one by one (iter_messages).",
    .tp_traverse = (traverseproc)message_iter_traverse,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)message_iter_next,
};

static PyObject *iter_messages(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "first", "verify", NULL};
    PyObject *buf, *first_obj = NULL;
    int verify = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$p:iter_messages", kwlist, &buf,
                                     &first_obj, &verify))
        return NULL;
    PyObject *data = PyBytes_Check(buf) ? Py_NewRef(buf) : PyBytes_FromObject(buf);
    if (data == NULL) return NULL;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    int mode = !verify ? CHECK_NONE : (size > STATE_AT && d[STATE_AT] == STATE_PRODUCED) ? 0 : 1;
    PyObject *header = parse(d, size, mode, 1);
    if (header == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    int64_t count = rd32(d + COUNT_AT), first = 0;
    int overflow = 0;
    if (first_obj != NULL) {
        if (!PyLong_Check(first_obj)) {
            PyErr_Format(PyExc_TypeError, "first must be an int, not %.100s",
                         Py_TYPE(first_obj)->tp_name);
            goto fail;
        }
        first = PyLong_AsLongLongAndOverflow(first_obj, &overflow);
        if (first == -1 && PyErr_Occurred()) goto fail;
    }
    if (overflow || first < 0 || first > count) {
        PyErr_Format(PyExc_ValueError, "message %R is not in a batch of %lld",
                     first_obj, (long long)count);
        goto fail;
    }
    MessageIter *it = PyObject_GC_New(MessageIter, &MessageIterType);
    if (it == NULL) goto fail;
    it->header = header;
    it->data = data;
    it->offsets.base = NULL;
    it->tables_at = rd16(d + 34);
    it->count = count;
    it->version = d[1];
    it->has_hashes = !(rd16(d + 32) & NO_TAG_HASHES);
    it->born_base = it->version == OLDEST_VERSION ? 0 : (int64_t)rd64(d + FIXED_HEADER_BYTES);
    it->records_at = it->tables_at + (it->has_hashes ? 12 : 4) * count;
    it->total = size;
    it->next = first;
    PyObject_GC_Track(it);
    /* queue offsets: base + i for message i (the twin's base + first .. for first ..) */
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        Py_DECREF(it);
        return NULL;
    }
    int rc = offsets_init(&it->offsets, header, zero, count);
    Py_DECREF(zero);
    if (rc < 0) {
        Py_DECREF(it);
        return NULL;
    }
    return (PyObject *)it;
fail:
    Py_DECREF(header);
    Py_DECREF(data);
    return NULL;
}

typedef struct {
    PyObject_HEAD
    PyObject *records; /* as given, until the first next() */
    PyObject *header;
    PyObject *first;
    PyObject *data; /* bytes, from the first next() */
    Offsets offsets;
    int64_t pos, made, remaining, born_base;
    int state; /* 0 not started, 1 walking, 2 finished */
    int version;
} RecordIter;

static void record_iter_dealloc(RecordIter *it)
{
    PyObject_GC_UnTrack(it);
    Py_XDECREF(it->records);
    Py_XDECREF(it->header);
    Py_XDECREF(it->first);
    Py_XDECREF(it->data);
    Py_XDECREF(it->offsets.base);
    PyObject_GC_Del(it);
}

static int record_iter_traverse(RecordIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->records);
    Py_VISIT(it->header);
    Py_VISIT(it->first);
    Py_VISIT(it->data);
    Py_VISIT(it->offsets.base);
    return 0;
}

/* The twin's iter_records is a generator: nothing happens before the first next(), and it ends
 * for good after raising. */
static PyObject *record_iter_next(RecordIter *it)
{
    if (it->state == 2) return NULL;
    if (it->state == 0) {
        it->state = 2;
        it->data = PyBytes_Check(it->records) ? Py_NewRef(it->records)
                                               : PyBytes_FromObject(it->records);
        if (it->data == NULL) return NULL;
        long long count;
        if (header_int(it->header, "count", &count) < 0) return NULL;
        int overflow = 0;
        long long first = PyLong_Check(it->first)
                              ? PyLong_AsLongLongAndOverflow(it->first, &overflow) : 0;
        if (!PyLong_Check(it->first) || overflow || (first == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "first must be an int of 64 bits");
            return NULL;
        }
        if (offsets_init(&it->offsets, it->header, it->first,
                         PyBytes_GET_SIZE(it->data) / RECORD_HEAD_BYTES + 1) < 0)
            return NULL;
        it->remaining = count - first;
        long long version, born_base;
        if (header_int(it->header, "version", &version) < 0 ||
            header_int(it->header, "born_base_ms", &born_base) < 0)
            return NULL;
        it->version = version == OLDEST_VERSION ? OLDEST_VERSION : 3;
        it->born_base = born_base;
        it->state = 1;
    }
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(it->data);
    int64_t size = PyBytes_GET_SIZE(it->data), pos = it->pos;
    if (pos >= size) {
        it->state = 2;
        if (it->remaining)
            malformed("the slice ends %lld records early", (long long)it->remaining);
        return NULL;
    }
    it->state = 2; /* until this record is made */
    if (it->remaining <= 0)
        return malformed("%lld bytes after the batch's last record", (long long)(size - pos));
    RecHead rh;
    int64_t at;
    int rc = read_head(d, pos, size, it->version, it->born_base, &rh, &at);
    if (rc == HEAD_OVERRUN)
        return malformed("record head at byte %lld overruns the slice", (long long)pos);
    if (rc == HEAD_BAD) return malformed("record head at byte %lld is malformed", (long long)pos);
    int64_t end = pos + record_size(&rh, pos, at);
    if (end > size) return malformed("record at byte %lld overruns the slice", (long long)pos);
    PyObject *offset = offsets_at(&it->offsets, it->made);
    if (offset == NULL) return NULL;
    PyObject *m = make_message(it->header, it->data, pos, end, offset, 0, it->version,
                               it->born_base);
    if (m == NULL) return NULL;
    it->state = 1;
    it->pos = end;
    it->made++;
    it->remaining--;
    return m;
}

static PyTypeObject RecordIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "raftmq.common._stored_batch_c.RecordIter",
    .tp_basicsize = sizeof(RecordIter),
    .tp_dealloc = (destructor)record_iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The messages of a slice of records, walked one by one (iter_records).",
    .tp_traverse = (traverseproc)record_iter_traverse,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)record_iter_next,
};

static PyObject *iter_records(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"records", "header", "first", NULL};
    PyObject *records, *header, *first;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:iter_records", kwlist, &records, &header,
                                     &first))
        return NULL;
    RecordIter *it = PyObject_GC_New(RecordIter, &RecordIterType);
    if (it == NULL) return NULL;
    it->records = Py_NewRef(records);
    it->header = Py_NewRef(header);
    it->first = Py_NewRef(first);
    it->data = NULL;
    it->offsets.base = NULL;
    it->pos = it->made = it->remaining = 0;
    it->state = 0;
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

/* ---- columns for Arrow (the Spark source): the twin's `columns` ------------------------------ */

static PyObject *BatchColumnsType; /* the twin's NamedTuple */

/* The queue offset base + p of a message, as the twin's Python int (for error texts). */
static PyObject *offset_obj(uint64_t base, int64_t p)
{
    PyObject *b = PyLong_FromUnsignedLongLong(base), *d = PyLong_FromLongLong(p);
    PyObject *r = (b && d) ? PyNumber_Add(b, d) : NULL;
    Py_XDECREF(b);
    Py_XDECREF(d);
    return r;
}

/* 0 when p[0:n] is utf-8 (ASCII in a loop, anything else by Python's own strict decoder, so
 * both implementations accept the same bytes); else the twin's MalformedBatchError, quoting
 * the decoder's UnicodeDecodeError. */
static int utf8_ok(const unsigned char *p, Py_ssize_t n, const char *what)
{
    Py_ssize_t i = 0;
    while (i < n && p[i] < 0x80) i++;
    if (i == n) return 0;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s != NULL) {
        Py_DECREF(s);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v != NULL) malformed("invalid utf-8 in a message %s: %S", what, v);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    return -1;
}

static int column_error(const char *fmt, uint64_t base, int64_t p)
{
    PyObject *o = offset_obj(base, p);
    if (o != NULL) {
        malformed(fmt, o);
        Py_DECREF(o);
    }
    return -1;
}

/* Sizes of the chosen messages' columns, found by the checking pass. */
typedef struct {
    int64_t n, body, key, tag, keys, key_bytes, props, names, values;
} ColumnSizes;

/* The checking pass over one record (the twin's loop body, in its order); adds its sizes. */
static int check_record(const unsigned char *d, int64_t pos, int64_t end, uint64_t base,
                        int64_t p, ColumnSizes *z, int version, int64_t born_base)
{
    RecHead rh;
    int64_t at;
    int rc = read_head(d, pos, end, version, born_base, &rh, &at);
    if (rc != HEAD_OK || pos + record_size(&rh, pos, at) != end) {
        /* the error texts are make_message's (an object for the offset only then) */
        PyObject *o = offset_obj(base, p);
        if (o != NULL) {
            checked_head(d, pos, end, version, born_base, o, &rh, &at);
            Py_DECREF(o);
        }
        return -1;
    }
    uint32_t body_len = rh.body_len, keys_len = rh.keys_len, props_len = rh.props_len;
    unsigned tag_len = rh.tag_len, n_keys = rh.n_keys;
    if (tag_len != NO_TAG) {
        if (utf8_ok(d + at, tag_len, "tag") < 0) return -1;
        z->tag += tag_len;
        at += tag_len;
    }
    int64_t kend = at + keys_len;
    for (unsigned k = 0; k < n_keys; k++) {
        if (at + 2 > kend)
            return column_error(
                "key length overruns the keys of the message at queue offset %S", base, p);
        unsigned n = rd16(d + at);
        at += 2;
        if (at + n > kend) {
            PyObject *o = offset_obj(base, p);
            if (o != NULL) {
                malformed("key of %u bytes overruns the keys of the message at queue offset %S",
                          n, o);
                Py_DECREF(o);
            }
            return -1;
        }
        if (utf8_ok(d + at, n, "key") < 0) return -1;
        if (k == 0) z->key += n;
        z->key_bytes += n;
        at += n;
    }
    if (at != kend) {
        PyObject *o = offset_obj(base, p);
        if (o != NULL) {
            malformed("%lld bytes after the keys of the message at queue offset %S",
                      (long long)(kend - at), o);
            Py_DECREF(o);
        }
        return -1;
    }
    z->keys += n_keys;
    int64_t pstart = at, pend = at + props_len;
    while (at < pend) {
        if (at + 6 > pend)
            return column_error(
                "property lengths overrun the message at queue offset %S", base, p);
        unsigned name_len = rd16(d + at);
        uint32_t value_len = rd32(d + at + 2);
        at += 6;
        int64_t stop = at + name_len + (int64_t)value_len;
        if (stop > pend)
            return column_error(
                "property overruns the properties of the message at queue offset %S", base, p);
        if (utf8_ok(d + at, name_len, "property name") < 0) return -1;
        /* a name seen before in this message: walk the earlier (already checked) pairs */
        for (int64_t q = pstart; q < at - 6;) {
            unsigned qn = rd16(d + q);
            uint32_t qv = rd32(d + q + 2);
            if (qn == name_len && memcmp(d + q + 6, d + at, name_len) == 0) {
                PyObject *name = PyUnicode_DecodeUTF8((const char *)d + at, name_len, "strict");
                PyObject *o = offset_obj(base, p);
                if (name != NULL && o != NULL)
                    malformed("property %R twice in the message at queue offset %S", name, o);
                Py_XDECREF(name);
                Py_XDECREF(o);
                return -1;
            }
            q += 6 + qn + (int64_t)qv;
        }
        if (utf8_ok(d + at + name_len, value_len, "property value") < 0) return -1;
        z->props += 1;
        z->names += name_len;
        z->values += value_len;
        at = stop;
    }
    z->body += body_len;
    return 0;
}

/* A column being filled: int32 offsets and the bytes, both preallocated to their exact size. */
typedef struct {
    PyObject *offsets_obj, *data_obj;
    int32_t *offsets;
    unsigned char *data;
    int64_t items, used;
} Column;

static int column_new(Column *c, int64_t items, int64_t bytes)
{
    c->offsets_obj = PyBytes_FromStringAndSize(NULL, 4 * (items + 1));
    c->data_obj = PyBytes_FromStringAndSize(NULL, bytes);
    if (c->offsets_obj == NULL || c->data_obj == NULL) return -1;
    c->offsets = (int32_t *)PyBytes_AS_STRING(c->offsets_obj);
    c->data = (unsigned char *)PyBytes_AS_STRING(c->data_obj);
    c->offsets[0] = 0;
    c->items = c->used = 0;
    return 0;
}

static inline void column_add(Column *c, const unsigned char *p, int64_t n)
{
    memcpy(c->data + c->used, p, (size_t)n);
    c->used += n;
    c->offsets[++c->items] = (int32_t)c->used;
}

enum { C_BODY, C_KEY, C_TAG, C_KEYS, C_NAMES, C_VALUES, C_N };

static PyObject *columns(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "positions", "verify", NULL};
    PyObject *buf, *positions;
    int verify = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$p:columns", kwlist, &buf, &positions,
                                     &verify))
        return NULL;
    PyObject *data = PyBytes_Check(buf) ? Py_NewRef(buf) : PyBytes_FromObject(buf);
    if (data == NULL) return NULL;
    PyObject *header = NULL, *seq = NULL, *out = NULL;
    PyObject *chosen = NULL, *born = NULL, *key_valid = NULL, *tag_valid = NULL;
    PyObject *keys_offsets = NULL, *props_offsets = NULL;
    Column cols[C_N];
    memset(cols, 0, sizeof cols);
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    int mode = !verify ? CHECK_NONE : (size > STATE_AT && d[STATE_AT] == STATE_PRODUCED) ? 0 : 1;
    if ((header = parse(d, size, mode, 1)) == NULL) goto done;
    if ((seq = PySequence_Fast(positions, "positions must be a sequence of ints")) == NULL)
        goto done;
    int64_t count = rd32(d + COUNT_AT), tables_at = rd16(d + 34);
    int version = d[1];
    int64_t born_base = version == OLDEST_VERSION ? 0 : (int64_t)rd64(d + FIXED_HEADER_BYTES);
    int64_t records_at = tables_at + ((rd16(d + 32) & NO_TAG_HASHES) ? 4 : 12) * count;
    const unsigned char *ends = d + records_at - 4 * count;
    uint64_t base = rd64(d + STAMP_AT);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if ((chosen = PyBytes_FromStringAndSize(NULL, 8 * (Py_ssize_t)n)) == NULL) goto done;
    int64_t *ps = (int64_t *)PyBytes_AS_STRING(chosen);
    ColumnSizes z = {0};
    int64_t prev = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0;
        long long p = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (p == -1 && PyErr_Occurred()) goto done;
        if (overflow || p < 0 || p >= count) {
            malformed("position %S is not in a batch of %lld messages", items[i],
                      (long long)count);
            goto done;
        }
        if (p <= prev) {
            malformed("positions are not ascending: %lld after %lld", p, (long long)prev);
            goto done;
        }
        prev = p;
        int64_t pos = records_at + rd32(ends + 4 * p);
        int64_t end = p + 1 < count ? records_at + rd32(ends + 4 * (p + 1)) : size;
        if (check_record(d, pos, end, base, p, &z, version, born_base) < 0) goto done;
        ps[i] = p;
    }
    int64_t biggest = z.body;
    int64_t others[5] = {z.key, z.tag, z.key_bytes, z.names, z.values};
    for (int i = 0; i < 5; i++) biggest = others[i] > biggest ? others[i] : biggest;
    if (biggest > INT32_MAX) {
        malformed("column data of %lld bytes do not fit Arrow's 32-bit offsets",
                  (long long)biggest);
        goto done;
    }
    int64_t sizes[C_N][2] = {{n, z.body}, {n, z.key}, {n, z.tag}, {z.keys, z.key_bytes},
                             {z.props, z.names}, {z.props, z.values}};
    for (int c = 0; c < C_N; c++) {
        if (column_new(&cols[c], sizes[c][0], sizes[c][1]) < 0) goto done;
    }
    Py_ssize_t bitmap = (n + 7) / 8;
    born = PyBytes_FromStringAndSize(NULL, 8 * n);
    key_valid = PyBytes_FromStringAndSize(NULL, bitmap);
    tag_valid = PyBytes_FromStringAndSize(NULL, bitmap);
    keys_offsets = PyBytes_FromStringAndSize(NULL, 4 * (n + 1));
    props_offsets = PyBytes_FromStringAndSize(NULL, 4 * (n + 1));
    if (!born || !key_valid || !tag_valid || !keys_offsets || !props_offsets) goto done;
    unsigned char *kv = (unsigned char *)PyBytes_AS_STRING(key_valid);
    unsigned char *tv = (unsigned char *)PyBytes_AS_STRING(tag_valid);
    int64_t *bm = (int64_t *)PyBytes_AS_STRING(born);
    int32_t *ko = (int32_t *)PyBytes_AS_STRING(keys_offsets);
    int32_t *po = (int32_t *)PyBytes_AS_STRING(props_offsets);
    memset(kv, 0, bitmap);
    memset(tv, 0, bitmap);
    ko[0] = po[0] = 0;
    /* The filling pass: every length was checked above, over the same immutable bytes. */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = ps[i];
        int64_t pos = records_at + rd32(ends + 4 * p);
        int64_t end = p + 1 < count ? records_at + rd32(ends + 4 * (p + 1)) : size;
        RecHead rh;
        int64_t at;
        read_head(d, pos, end, version, born_base, &rh, &at);
        uint32_t body_len = rh.body_len, props_len = rh.props_len;
        unsigned tag_len = rh.tag_len, n_keys = rh.n_keys;
        bm[i] = rh.born;
        if (tag_len != NO_TAG) {
            tv[i >> 3] |= (unsigned char)(1u << (i & 7));
            column_add(&cols[C_TAG], d + at, tag_len);
            at += tag_len;
        } else {
            column_add(&cols[C_TAG], d, 0);
        }
        for (unsigned k = 0; k < n_keys; k++) {
            unsigned len = rd16(d + at);
            if (k == 0) {
                kv[i >> 3] |= (unsigned char)(1u << (i & 7));
                column_add(&cols[C_KEY], d + at + 2, len);
            }
            column_add(&cols[C_KEYS], d + at + 2, len);
            at += 2 + len;
        }
        if (n_keys == 0) column_add(&cols[C_KEY], d, 0);
        ko[i + 1] = (int32_t)cols[C_KEYS].items;
        int64_t pend = at + props_len;
        while (at < pend) {
            unsigned name_len = rd16(d + at);
            uint32_t value_len = rd32(d + at + 2);
            column_add(&cols[C_NAMES], d + at + 6, name_len);
            column_add(&cols[C_VALUES], d + at + 6 + name_len, value_len);
            at += 6 + name_len + (int64_t)value_len;
        }
        po[i + 1] = (int32_t)cols[C_NAMES].items;
        column_add(&cols[C_BODY], d + end - body_len, body_len);
    }
    out = PyObject_CallFunctionObjArgs(
        BatchColumnsType, header, chosen, cols[C_BODY].offsets_obj, cols[C_BODY].data_obj,
        key_valid, cols[C_KEY].offsets_obj, cols[C_KEY].data_obj, tag_valid,
        cols[C_TAG].offsets_obj, cols[C_TAG].data_obj, keys_offsets, cols[C_KEYS].offsets_obj,
        cols[C_KEYS].data_obj, props_offsets, cols[C_NAMES].offsets_obj, cols[C_NAMES].data_obj,
        cols[C_VALUES].offsets_obj, cols[C_VALUES].data_obj, born, NULL);
done:
    for (int c = 0; c < C_N; c++) {
        Py_XDECREF(cols[c].offsets_obj);
        Py_XDECREF(cols[c].data_obj);
    }
    Py_XDECREF(born);
    Py_XDECREF(key_valid);
    Py_XDECREF(tag_valid);
    Py_XDECREF(keys_offsets);
    Py_XDECREF(props_offsets);
    Py_XDECREF(chosen);
    Py_XDECREF(seq);
    Py_XDECREF(header);
    Py_DECREF(data);
    return out;
}

/* ---- the module ------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"encode_batch", (PyCFunction)(void (*)(void))encode_batch, METH_VARARGS | METH_KEYWORDS,
     "The stored bytes of one queue's batch, unstamped, with its body CRC."},
    {"encode_bodies", (PyCFunction)(void (*)(void))encode_bodies, METH_VARARGS | METH_KEYWORDS,
     "encode_batch of bare bodies, from (born ms, bodies) runs."},
    {"body_sizes", (PyCFunction)(void (*)(void))body_sizes, METH_FASTCALL | METH_KEYWORDS,
     "(total, smallest, biggest) body bytes of a body column's rows."},
    {"check_batch", (PyCFunction)(void (*)(void))check_batch, METH_VARARGS | METH_KEYWORDS,
     "The leader's check of a batch as produced."},
    {"verify_stamped", (PyCFunction)(void (*)(void))verify_stamped, METH_FASTCALL | METH_KEYWORDS,
     "A stamped batch read back: both CRCs."},
    {"read_header", (PyCFunction)(void (*)(void))read_header, METH_FASTCALL | METH_KEYWORDS,
     "The header of a batch verified once already."},
    {"stamp", (PyCFunction)(void (*)(void))stamp, METH_VARARGS | METH_KEYWORDS,
     "Writes the base offset, the store time and the stamp CRC in place."},
    {"batch_count", (PyCFunction)(void (*)(void))batch_count, METH_FASTCALL | METH_KEYWORDS,
     "The message count of a checked batch."},
    {"tag_hashes", (PyCFunction)(void (*)(void))tag_hashes, METH_VARARGS | METH_KEYWORDS,
     "The batch's packed tag hashes (u64 each)."},
    {"message_offsets", (PyCFunction)(void (*)(void))message_offsets,
     METH_VARARGS | METH_KEYWORDS, "Each message's record offset (u32 each)."},
    {"slice_from", (PyCFunction)(void (*)(void))slice_from, METH_VARARGS | METH_KEYWORDS,
     "The records of messages k.., without copying."},
    {"iter_messages", (PyCFunction)(void (*)(void))iter_messages, METH_VARARGS | METH_KEYWORDS,
     "The messages first.. of a whole stored batch."},
    {"iter_records", (PyCFunction)(void (*)(void))iter_records, METH_VARARGS | METH_KEYWORDS,
     "The messages in a slice of records."},
    {"columns", (PyCFunction)(void (*)(void))columns, METH_VARARGS | METH_KEYWORDS,
     "Chosen messages of a whole stored batch as Arrow column buffers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_stored_batch_c",
    .m_doc = "The compiled twin of the v2 stored batch codec (see raftmq.common.stored_batch).",
    .m_size = -1,
    .m_methods = methods,
};

static int take(PyObject *from, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(from, name);
    return *out == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__stored_batch_c(void)
{
#if PY_BIG_ENDIAN
    PyErr_SetString(PyExc_ImportError, "the compiled stored batch codec is little-endian only");
    return NULL;
#endif
    PyObject *twin = PyImport_ImportModule("raftmq.common._stored_batch_py");
    if (twin == NULL) return NULL;
    PyObject *types[4] = {NULL};
    int rc = take(twin, "MalformedBatchError", &MalformedBatchError) ||
             take(twin, "UnsupportedBatchError", &UnsupportedBatchError) ||
             take(twin, "DEFAULT_LIMITS", &DefaultLimits) || take(twin, "crc32c", &CrcFn) ||
             take(twin, "tag_hash", &TagHashFn) || take(twin, "BatchHeader", &types[0]) ||
             take(twin, "BatchMessage", &types[1]) ||
             take(twin, "ProducerSequence", &types[2]) || take(twin, "Message", &types[3]) ||
             take(twin, "BatchColumns", &BatchColumnsType) ||
             take(twin, "BodyColumn", &BodyColumnType);
    Py_DECREF(twin);
    if (rc) return NULL;
    for (int i = 0; i < 4; i++) {
        if (!PyType_Check(types[i])) {
            PyErr_SetString(PyExc_ImportError, "the twin's types are not classes");
            return NULL;
        }
    }
    BatchHeaderType = (PyTypeObject *)types[0];
    BatchMessageType = (PyTypeObject *)types[1];
    ProducerSequenceType = (PyTypeObject *)types[2];
    MessageType = (PyTypeObject *)types[3];
    if (slot_offsets(BatchHeaderType, HeaderFields, HeaderSlots, H_N) < 0 ||
        slot_offsets(ProducerSequenceType, ProducerFields, ProducerSlots, P_N) < 0 ||
        slot_offsets(BatchMessageType, MessageSlotNames, MessageSlots, B_N) < 0)
        return NULL;
    for (int i = 0; i < M_N; i++) {
        if ((MessageFieldSlots[i] = slot_offset(MessageType, MessageFields[i])) < 0) return NULL;
        if ((MessageFieldNames[i] = PyUnicode_InternFromString(MessageFields[i])) == NULL)
            return NULL;
    }
    if (PyType_Ready(&MessageIterType) < 0 || PyType_Ready(&RecordIterType) < 0) return NULL;
    return PyModule_Create(&module);
}
