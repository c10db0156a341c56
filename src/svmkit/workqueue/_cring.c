/* svmkit.workqueue._cring: the host side of sk.WorkQueue's ring, with real C11-style atomics.
 *
 * Optional: setup.py builds it when a C compiler is present; svmkit/workqueue/ring.py has a
 * pure-Python ring with the same methods and semantics.  Layout and protocol are those of
 * kernels/svmkit_workqueue.h (Vyukov's bounded MPMC queue; bit 63 of tail = closed).  The
 * layout constants come from svmkit/workqueue/layout.py: setup.py defines SVMKIT_WQ_*, and
 * the module exports them as LAYOUT, which ring.py compares before using this ring.
 *
 * Memory orders: slot seq loads are ACQUIRE, seq stores RELEASE (they carry the item);
 * head/tail compare-exchanges are relaxed on the single-item path (as on the device) and
 * the batch reservation reads head with ACQUIRE; close is a SEQ_CST fetch-or on tail.
 * The GCC/Clang __atomic builtins emit the right instructions on every architecture.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sched.h>

#if !defined(SVMKIT_WQ_HEAD_OFFSET) || !defined(SVMKIT_WQ_TAIL_OFFSET) ||                \
    !defined(SVMKIT_WQ_CLOSED_OFFSET) || !defined(SVMKIT_WQ_HEADER_BYTES) ||              \
    !defined(SVMKIT_WQ_SLOT_BYTES_OFFSET) || !defined(SVMKIT_WQ_ITEM_OFFSET) ||           \
    !defined(SVMKIT_WQ_CLOSED_BIT) || !defined(SVMKIT_WQ_PARAMS_OFFSET) ||                \
    !defined(SVMKIT_WQ_MAGIC) || !defined(SVMKIT_WQ_MAX_ITEM_BYTES) ||                    \
    !defined(SVMKIT_WQ_ITEM_SIZE_OFFSET) || !defined(SVMKIT_WQ_MAGIC_OFFSET)
#error "build through setup.py: the ring layout comes from svmkit/workqueue/layout.py"
#endif
#define CLOSED_BIT SVMKIT_WQ_CLOSED_BIT
#define HEAD_OFF SVMKIT_WQ_HEAD_OFFSET
#define TAIL_OFF SVMKIT_WQ_TAIL_OFFSET
#define CLOSED_OFF SVMKIT_WQ_CLOSED_OFFSET
#define HEADER_BYTES SVMKIT_WQ_HEADER_BYTES

#define ITEM_OFF SVMKIT_WQ_ITEM_OFFSET
#define MAX_ITEM SVMKIT_WQ_MAX_ITEM_BYTES

/* A slot: seq (uint64) at +0, the item at ITEM_OFF; slots are `stride` bytes apart, the
 * stride read from the ring's header (slot_bytes), as the Python ring and the device do. */
typedef struct {
    uint64_t seq;
} slot_t;

typedef struct {
    PyObject_HEAD
    uint64_t *head;
    uint64_t *tail;
    uint32_t *closed;
    unsigned char *slots;
    uint64_t mask;
    uint64_t stride;
    Py_ssize_t itemsize;
    char kind; /* 'i' signed, 'u' unsigned, 'f' float, 'r' raw bits (Python converts),
                  'b' a record of itemsize bytes (bytes in, bytes out) */
} Ring;

static inline slot_t *slot_at(const Ring *r, uint64_t pos)
{
    return (slot_t *)(r->slots + (pos & r->mask) * r->stride);
}

static inline unsigned char *item_of(slot_t *s)
{
    return (unsigned char *)s + ITEM_OFF;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- item conversion ------------------------------------------------------------------ */

static int to_bits(Ring *r, PyObject *obj, unsigned char *out)
{
    if (r->kind == 'b') {
        Py_buffer view;
        if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
            return -1;
        int ok = view.len == r->itemsize;
        if (ok)
            memcpy(out, view.buf, (size_t)r->itemsize);
        PyBuffer_Release(&view);
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "a record item must be %zd bytes", r->itemsize);
            return -1;
        }
        return 0;
    }
    if (r->kind == 'f') {
        double d = PyFloat_AsDouble(obj);
        if (d == -1.0 && PyErr_Occurred())
            return -1;
        if (r->itemsize == 8) {
            memcpy(out, &d, 8);
        } else {
            float f = (float)d;
            memcpy(out, &f, 4);
        }
        return 0;
    }
    if (r->kind == 'i') {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (r->itemsize < 8) {
            long long lim = 1LL << (8 * r->itemsize - 1);
            if (v < -lim || v >= lim) {
                PyErr_Format(PyExc_OverflowError, "Python integer %lld out of bounds for int%d",
                             v, (int)(8 * r->itemsize));
                return -1;
            }
        }
        int8_t i8 = (int8_t)v;
        int16_t i16 = (int16_t)v;
        int32_t i32 = (int32_t)v;
        switch (r->itemsize) {
        case 1: memcpy(out, &i8, 1); break;
        case 2: memcpy(out, &i16, 2); break;
        case 4: memcpy(out, &i32, 4); break;
        default: memcpy(out, &v, 8);
        }
        return 0;
    }
    /* 'u' and 'r' */
    if (PyLong_Check(obj) && _PyLong_Sign(obj) < 0) {
        PyErr_Format(PyExc_OverflowError, "Python integer %R out of bounds for uint%d", obj,
                     (int)(8 * r->itemsize));
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (r->itemsize < 8 && (v >> (8 * r->itemsize)) != 0) {
        PyErr_Format(PyExc_OverflowError, "Python integer %llu out of bounds for uint%d", v,
                     (int)(8 * r->itemsize));
        return -1;
    }
    uint8_t u8 = (uint8_t)v;
    uint16_t u16 = (uint16_t)v;
    uint32_t u32 = (uint32_t)v;
    switch (r->itemsize) {
    case 1: memcpy(out, &u8, 1); break;
    case 2: memcpy(out, &u16, 2); break;
    case 4: memcpy(out, &u32, 4); break;
    default: memcpy(out, &v, 8);
    }
    return 0;
}

static PyObject *from_bits(Ring *r, const unsigned char *in)
{
    switch (r->kind) {
    case 'b':
        return PyBytes_FromStringAndSize((const char *)in, r->itemsize);
    case 'f':
        if (r->itemsize == 8) {
            double d;
            memcpy(&d, in, 8);
            return PyFloat_FromDouble(d);
        } else {
            float f;
            memcpy(&f, in, 4);
            return PyFloat_FromDouble((double)f);
        }
    case 'i': {
        int8_t i8; int16_t i16; int32_t i32; int64_t i64;
        switch (r->itemsize) {
        case 1: memcpy(&i8, in, 1); return PyLong_FromLong(i8);
        case 2: memcpy(&i16, in, 2); return PyLong_FromLong(i16);
        case 4: memcpy(&i32, in, 4); return PyLong_FromLong(i32);
        default: memcpy(&i64, in, 8); return PyLong_FromLongLong(i64);
        }
    }
    default: {
        uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64;
        switch (r->itemsize) {
        case 1: memcpy(&u8, in, 1); return PyLong_FromUnsignedLong(u8);
        case 2: memcpy(&u16, in, 2); return PyLong_FromUnsignedLong(u16);
        case 4: memcpy(&u32, in, 4); return PyLong_FromUnsignedLong(u32);
        default: memcpy(&u64, in, 8); return PyLong_FromUnsignedLongLong(u64);
        }
    }
    }
}

/* ---- ring operations (no Python objects) ------------------------------------------------ */

/* 1 pushed, 0 full, -1 closed */
static int ring_try_push(Ring *r, const unsigned char *bits)
{
    uint64_t pos = __atomic_load_n(r->tail, __ATOMIC_RELAXED);
    for (;;) {
        if (pos & CLOSED_BIT)
            return -1;
        slot_t *s = slot_at(r, pos);
        int64_t dif = (int64_t)(__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) - pos);
        if (dif == 0) {
            if (__atomic_compare_exchange_n(r->tail, &pos, pos + 1, 1, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED)) {
                memcpy(item_of(s), bits, (size_t)r->itemsize);
                __atomic_store_n(&s->seq, pos + 1, __ATOMIC_RELEASE);
                return 1;
            }
        } else if (dif < 0) {
            return 0;
        } else {
            pos = __atomic_load_n(r->tail, __ATOMIC_RELAXED);
        }
    }
}

/* 1 popped, 0 empty */
static int ring_try_pop(Ring *r, unsigned char *bits)
{
    uint64_t pos = __atomic_load_n(r->head, __ATOMIC_RELAXED);
    for (;;) {
        slot_t *s = slot_at(r, pos);
        int64_t dif = (int64_t)(__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) - (pos + 1));
        if (dif == 0) {
            if (__atomic_compare_exchange_n(r->head, &pos, pos + 1, 1, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED)) {
                memcpy(bits, item_of(s), (size_t)r->itemsize);
                __atomic_store_n(&s->seq, pos + r->mask + 1, __ATOMIC_RELEASE);
                return 1;
            }
        } else if (dif < 0) {
            return 0;
        } else {
            pos = __atomic_load_n(r->head, __ATOMIC_RELAXED);
        }
    }
}

/* Claim up to n free positions with one compare-exchange of tail: returns the count (0
 * full, -1 closed) and the first position in *start. */
static Py_ssize_t ring_reserve_push(Ring *r, Py_ssize_t n, uint64_t *start)
{
    uint64_t cap = r->mask + 1;
    uint64_t pos = __atomic_load_n(r->tail, __ATOMIC_RELAXED);
    for (;;) {
        if (pos & CLOSED_BIT)
            return -1;
        uint64_t head = __atomic_load_n(r->head, __ATOMIC_ACQUIRE);
        int64_t used = (int64_t)(pos - head);
        if (used < 0) /* device consumers claimed ahead (wq_pop): every slot from tail on is
                         free, or being freed by last lap's consumer (ring_fill waits) */
            used = 0;
        if ((uint64_t)used >= cap)
            return 0;
        uint64_t k = cap - (uint64_t)used;
        if ((uint64_t)n < k)
            k = (uint64_t)n;
        if (__atomic_compare_exchange_n(r->tail, &pos, pos + k, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *start = pos;
            return (Py_ssize_t)k;
        }
    }
}

/* Fill claimed positions [start, start+k): wait for last lap's consumer to free each slot
 * (it claimed it already, so this never waits on a blocked agent), write, publish. */
static void ring_fill(Ring *r, uint64_t start, Py_ssize_t k, const unsigned char *src)
{
    size_t isz = (size_t)r->itemsize;
    for (Py_ssize_t i = 0; i < k; i++) {
        uint64_t pos = start + (uint64_t)i;
        slot_t *s = slot_at(r, pos);
        while (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != pos)
            cpu_relax();
        memcpy(item_of(s), src + (size_t)i * isz, isz);
        __atomic_store_n(&s->seq, pos + 1, __ATOMIC_RELEASE);
    }
}

/* Claim the run of published items at head (at most n) with one compare-exchange. */
static Py_ssize_t ring_reserve_pop(Ring *r, Py_ssize_t n, uint64_t *start)
{
    uint64_t pos = __atomic_load_n(r->head, __ATOMIC_RELAXED);
    for (;;) {
        Py_ssize_t k = 0;
        while (k < n) {
            uint64_t p = pos + (uint64_t)k;
            uint64_t seq = __atomic_load_n(&slot_at(r, p)->seq, __ATOMIC_ACQUIRE);
            if (seq != p + 1)
                break;
            k++;
        }
        if (k == 0) {
            uint64_t seq = __atomic_load_n(&slot_at(r, pos)->seq, __ATOMIC_ACQUIRE);
            if ((int64_t)(seq - (pos + 1)) > 0) { /* head moved on */
                pos = __atomic_load_n(r->head, __ATOMIC_RELAXED);
                continue;
            }
            return 0;
        }
        if (__atomic_compare_exchange_n(r->head, &pos, pos + (uint64_t)k, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *start = pos;
            return k;
        }
    }
}

static void ring_drain_into(Ring *r, uint64_t start, Py_ssize_t k, unsigned char *dst)
{
    size_t isz = (size_t)r->itemsize;
    uint64_t cap = r->mask + 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        uint64_t pos = start + (uint64_t)i;
        slot_t *s = slot_at(r, pos);
        memcpy(dst + (size_t)i * isz, item_of(s), isz);
        __atomic_store_n(&s->seq, pos + cap, __ATOMIC_RELEASE);
    }
}

static int ring_drained(Ring *r)
{
    uint64_t tail = __atomic_load_n(r->tail, __ATOMIC_ACQUIRE);
    if (!(tail & CLOSED_BIT))
        return 0;
    uint64_t head = __atomic_load_n(r->head, __ATOMIC_ACQUIRE);
    return (int64_t)(head - (tail & ~CLOSED_BIT)) >= 0;
}

/* ---- Python methods ----------------------------------------------------------------------- */

static int Ring_init(Ring *self, PyObject *args, PyObject *kwds)
{
    unsigned long long address, capacity;
    Py_ssize_t itemsize;
    int kind;
    static char *kwlist[] = {"address", "capacity", "itemsize", "kind", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKnC", kwlist, &address, &capacity,
                                     &itemsize, &kind))
        return -1;
    if (capacity < 2 || (capacity & (capacity - 1)) || itemsize < 1 ||
        itemsize > (kind == 'b' ? MAX_ITEM : 8) ||
        (kind != 'i' && kind != 'u' && kind != 'f' && kind != 'r' && kind != 'b') ||
        (kind == 'f' && itemsize != 4 && itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "bad ring parameters");
        return -1;
    }
    char *base = (char *)(uintptr_t)address;
    /* The header the host wrote decides the stride; it must describe this ring. */
    uint64_t hdr_capacity;
    uint32_t hdr_itemsize, hdr_magic, hdr_stride;
    memcpy(&hdr_capacity, base + SVMKIT_WQ_PARAMS_OFFSET + 8, 8);
    memcpy(&hdr_itemsize, base + SVMKIT_WQ_ITEM_SIZE_OFFSET, 4);
    memcpy(&hdr_magic, base + SVMKIT_WQ_MAGIC_OFFSET, 4);
    memcpy(&hdr_stride, base + SVMKIT_WQ_SLOT_BYTES_OFFSET, 4);
    if (hdr_magic != SVMKIT_WQ_MAGIC || hdr_capacity != capacity ||
        hdr_itemsize != (uint32_t)itemsize || hdr_stride % 8 ||
        hdr_stride < ITEM_OFF + (uint64_t)itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "the ring header does not describe this ring (magic %#x, capacity %llu, "
                     "item size %u, slot bytes %u)",
                     hdr_magic, (unsigned long long)hdr_capacity, hdr_itemsize, hdr_stride);
        return -1;
    }
    self->head = (uint64_t *)(base + HEAD_OFF);
    self->tail = (uint64_t *)(base + TAIL_OFF);
    self->closed = (uint32_t *)(base + CLOSED_OFF);
    self->slots = (unsigned char *)(base + HEADER_BYTES);
    self->stride = hdr_stride;
    self->mask = capacity - 1;
    self->itemsize = itemsize;
    self->kind = (char)kind;
    return 0;
}

static PyObject *Ring_try_push(Ring *self, PyObject *item)
{
    unsigned char bits[MAX_ITEM] = {0};
    if (to_bits(self, item, bits) < 0)
        return NULL;
    return PyLong_FromLong(ring_try_push(self, bits));
}

static PyObject *Ring_try_pop(Ring *self, PyObject *Py_UNUSED(ignored))
{
    unsigned char bits[MAX_ITEM];
    if (!ring_try_pop(self, bits))
        Py_RETURN_NONE;
    return from_bits(self, bits);
}

static int get_contiguous(PyObject *obj, Py_buffer *view, int writable, Ring *self)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->len % self->itemsize) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "buffer size is not a multiple of the item size");
        return -1;
    }
    return 0;
}

/* try_push_many(buffer, start) -> pushed count (0 full, -1 closed) from item `start` on */
static PyObject *Ring_try_push_many(Ring *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "On", &obj, &first))
        return NULL;
    Py_buffer view;
    if (get_contiguous(obj, &view, 0, self) < 0)
        return NULL;
    Py_ssize_t n = view.len / self->itemsize - first;
    Py_ssize_t k = 0;
    if (n > 0) {
        uint64_t start;
        k = ring_reserve_push(self, n, &start);
        if (k > 0) {
            const unsigned char *src = (const unsigned char *)view.buf + first * self->itemsize;
            if (k >= 512) {
                Py_BEGIN_ALLOW_THREADS
                ring_fill(self, start, k, src);
                Py_END_ALLOW_THREADS
            } else {
                ring_fill(self, start, k, src);
            }
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(k);
}

/* try_pop_many(buffer, start) -> popped count into buffer[start:] */
static PyObject *Ring_try_pop_many(Ring *self, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "On", &obj, &first))
        return NULL;
    Py_buffer view;
    if (get_contiguous(obj, &view, 1, self) < 0)
        return NULL;
    Py_ssize_t n = view.len / self->itemsize - first;
    Py_ssize_t k = 0;
    if (n > 0) {
        uint64_t start;
        k = ring_reserve_pop(self, n, &start);
        if (k > 0) {
            unsigned char *dst = (unsigned char *)view.buf + first * self->itemsize;
            if (k >= 512) {
                Py_BEGIN_ALLOW_THREADS
                ring_drain_into(self, start, k, dst);
                Py_END_ALLOW_THREADS
            } else {
                ring_drain_into(self, start, k, dst);
            }
        }
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(k);
}

static PyObject *Ring_close(Ring *self, PyObject *Py_UNUSED(ignored))
{
    uint64_t old = __atomic_fetch_or(self->tail, CLOSED_BIT, __ATOMIC_SEQ_CST);
    __atomic_store_n(self->closed, 1u, __ATOMIC_RELEASE);
    return PyBool_FromLong(!(old & CLOSED_BIT));
}

/* reopen() -> 1 reopened, 0 it was open, -1 not drained.  Positions consumers claimed
 * ahead of tail (a wq_pop waiting when the queue closed) are marked consumed (seq = pos +
 * capacity) and tail moves up to head, so the next lap finds every slot free.  The caller
 * makes sure nothing else uses the ring meanwhile. */
static PyObject *Ring_reopen(Ring *self, PyObject *Py_UNUSED(ignored))
{
    uint64_t old = __atomic_load_n(self->tail, __ATOMIC_ACQUIRE);
    if (!(old & CLOSED_BIT))
        return PyLong_FromLong(0);
    uint64_t pos = old & ~CLOSED_BIT;
    uint64_t head = __atomic_load_n(self->head, __ATOMIC_ACQUIRE);
    if ((int64_t)(head - pos) < 0)
        return PyLong_FromLong(-1);
    for (uint64_t p = pos; p != head; p++)
        __atomic_store_n(&slot_at(self, p)->seq, p + self->mask + 1, __ATOMIC_RELEASE);
    if (!__atomic_compare_exchange_n(self->tail, &old, head, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST))
        return PyLong_FromLong(0);
    __atomic_store_n(self->closed, 0u, __ATOMIC_RELEASE);
    return PyLong_FromLong(1);
}

static PyObject *Ring_closed(Ring *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong((__atomic_load_n(self->tail, __ATOMIC_ACQUIRE) & CLOSED_BIT) != 0);
}

static PyObject *Ring_drained(Ring *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(ring_drained(self));
}

static PyObject *Ring_length(Ring *self, PyObject *Py_UNUSED(ignored))
{
    uint64_t head = __atomic_load_n(self->head, __ATOMIC_ACQUIRE);
    uint64_t tail = __atomic_load_n(self->tail, __ATOMIC_ACQUIRE) & ~CLOSED_BIT;
    int64_t n = (int64_t)(tail - head);
    if (n < 0)
        n = 0;
    if ((uint64_t)n > self->mask + 1)
        n = (int64_t)(self->mask + 1);
    return PyLong_FromLongLong(n);
}

/* Whether the slot of position `pos` is ready: published (for_pop) or free (for push). */
static inline int slot_ready(Ring *self, int for_pop, uint64_t pos)
{
    uint64_t seq = __atomic_load_n(&slot_at(self, pos)->seq, __ATOMIC_ACQUIRE);
    return (int64_t)(seq - (pos + (for_pop ? 1 : 0))) >= 0;
}

/* Once the first slot is ready, how long wait() keeps gathering for `want` ready slots. */
#define GATHER_NS 2000u
/* The longest one wait() holds the thread in C (signals and timeouts are seen between). */
#define WAIT_CAP_NS 5000000u
/* With WAIT_YIELD, how long nothing may move before the spin yields the core (each look). */
#define YIELD_AFTER_NS 5000u
/* wait() flags: WAIT_ONE_SPINNER: a CPU device, whose work-items run on the host's cores, so
 * at most one host thread spins at a time (others return at once and back off to sleeping:
 * host threads spinning on every core starve the kernel they wait for); WAIT_YIELD: also
 * yield the core once nothing moved for YIELD_AFTER_NS (single-item waits: latency). */
#define WAIT_ONE_SPINNER 1
#define WAIT_YIELD 2
static int spinners; /* host threads spinning in a WAIT_ONE_SPINNER wait */

/* wait(for_pop, idle_ns, want=1, flags=0): spin without the GIL until the slot at head
 * (for_pop) or tail is ready, or the queue closes; True then.  While the other side moves
 * (tail for a pop, head for a push: it publishes or frees slots) the wait goes on, however
 * long: a ring being drained is waited for by spinning, never by sleeping.  False once the
 * other side did not move for idle_ns (the caller backs off to sleeping).  With want > 1,
 * once the slot is ready it keeps spinning up to GATHER_NS for the slot want - 1 further on,
 * so that a batch call claims a run instead of trailing the other side slot by slot.  At
 * most WAIT_CAP_NS in one call (then True: the caller retries).  `flags`: WAIT_ONE_SPINNER
 * and WAIT_YIELD above; a WAIT_ONE_SPINNER wait that finds another thread spinning returns
 * False at once.  While the other side moves the spin never yields (yielding on every look
 * made a drained producer several times slower). */
static PyObject *Ring_wait(Ring *self, PyObject *args)
{
    int for_pop, flags = 0;
    unsigned long long idle_ns;
    Py_ssize_t want = 1;
    if (!PyArg_ParseTuple(args, "pK|ni", &for_pop, &idle_ns, &want, &flags))
        return NULL;
    if (want < 1)
        want = 1;
    if ((uint64_t)want > self->mask + 1)
        want = (Py_ssize_t)(self->mask + 1);
    if ((flags & WAIT_ONE_SPINNER) && __atomic_fetch_add(&spinners, 1, __ATOMIC_ACQ_REL) > 0) {
        __atomic_fetch_sub(&spinners, 1, __ATOMIC_ACQ_REL);
        Py_RETURN_FALSE; /* another thread spins: this one backs off to sleeping */
    }
    int ready = 1;
    Py_BEGIN_ALLOW_THREADS
    uint64_t *counter = for_pop ? self->head : self->tail;
    uint64_t *other = for_pop ? self->tail : self->head;
    uint64_t start = now_ns();
    uint64_t moved_at = start;
    uint64_t seen = __atomic_load_n(other, __ATOMIC_RELAXED);
    uint64_t first_ready = 0;
    for (unsigned spins = 1;; spins++) {
        if (__atomic_load_n(self->closed, __ATOMIC_ACQUIRE))
            break;
        uint64_t pos = __atomic_load_n(counter, __ATOMIC_RELAXED) & ~CLOSED_BIT;
        if (slot_ready(self, for_pop, pos)) {
            if (want == 1 || slot_ready(self, for_pop, pos + (uint64_t)want - 1))
                break;
            if (first_ready == 0)
                first_ready = now_ns();
            else if ((spins & 15) == 0 && now_ns() - first_ready >= GATHER_NS)
                break;
        }
        cpu_relax();
        if ((spins & 63) == 0) {
            uint64_t t = now_ns();
            uint64_t o = __atomic_load_n(other, __ATOMIC_RELAXED);
            if (o != seen) {
                seen = o;
                moved_at = t;
            } else if (t - moved_at >= idle_ns) {
                ready = 0;
                break;
            }
            if (t - start >= WAIT_CAP_NS)
                break;
            if ((flags & WAIT_YIELD) && t - moved_at >= YIELD_AFTER_NS)
                sched_yield();
        }
    }
    Py_END_ALLOW_THREADS
    if (flags & WAIT_ONE_SPINNER)
        __atomic_fetch_sub(&spinners, 1, __ATOMIC_ACQ_REL);
    return PyBool_FromLong(ready);
}

static PyMethodDef Ring_methods[] = {
    {"try_push", (PyCFunction)Ring_try_push, METH_O, "1 pushed, 0 full, -1 closed"},
    {"try_pop", (PyCFunction)Ring_try_pop, METH_NOARGS, "the item, or None when empty"},
    {"try_push_many", (PyCFunction)Ring_try_push_many, METH_VARARGS,
     "push buffer[start:] with one reservation: count pushed, 0 full, -1 closed"},
    {"try_pop_many", (PyCFunction)Ring_try_pop_many, METH_VARARGS,
     "pop into buffer[start:] with one reservation: count popped"},
    {"close", (PyCFunction)Ring_close, METH_NOARGS, "set the closed bit; True if it was open"},
    {"reopen", (PyCFunction)Ring_reopen, METH_NOARGS,
     "clear the closed bit of a drained ring: 1 reopened, 0 open, -1 not drained"},
    {"closed", (PyCFunction)Ring_closed, METH_NOARGS, "whether the closed bit is set"},
    {"drained", (PyCFunction)Ring_drained, METH_NOARGS, "closed and every item popped"},
    {"length", (PyCFunction)Ring_length, METH_NOARGS, "items claimed but not yet popped"},
    {"wait", (PyCFunction)Ring_wait, METH_VARARGS, "spin without the GIL while the other side moves, until the ring is ready; False: idle"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "svmkit.workqueue._cring.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Host operations on a svmkit work-queue ring at a fixed address.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_methods = Ring_methods,
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_cring",
    "Native host operations on svmkit work-queue rings (optional).", -1, NULL,
};

PyMODINIT_FUNC PyInit__cring(void)
{
    if (PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *layout = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsK}", "HEAD_OFFSET", (unsigned long long)SVMKIT_WQ_HEAD_OFFSET,
        "TAIL_OFFSET", (unsigned long long)SVMKIT_WQ_TAIL_OFFSET, "CLOSED_OFFSET",
        (unsigned long long)SVMKIT_WQ_CLOSED_OFFSET, "PARAMS_OFFSET",
        (unsigned long long)SVMKIT_WQ_PARAMS_OFFSET, "ITEM_SIZE_OFFSET",
        (unsigned long long)SVMKIT_WQ_ITEM_SIZE_OFFSET, "MAGIC_OFFSET",
        (unsigned long long)SVMKIT_WQ_MAGIC_OFFSET, "SLOT_BYTES_OFFSET",
        (unsigned long long)SVMKIT_WQ_SLOT_BYTES_OFFSET, "HEADER_BYTES",
        (unsigned long long)SVMKIT_WQ_HEADER_BYTES, "ITEM_OFFSET",
        (unsigned long long)SVMKIT_WQ_ITEM_OFFSET, "MAX_ITEM_BYTES",
        (unsigned long long)SVMKIT_WQ_MAX_ITEM_BYTES, "MAGIC", (unsigned long long)SVMKIT_WQ_MAGIC,
        "CLOSED_BIT", (unsigned long long)SVMKIT_WQ_CLOSED_BIT);
    if (layout == NULL || PyModule_AddObject(m, "LAYOUT", layout) < 0) {
        Py_XDECREF(layout);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
