/* svmkit.resources._cpool: the pool's hot path, in C.
 *
 * A pooled allocation and its free() are the calls data-science code makes most often (every
 * temporary array), so the work they do on the common path lives here, once:
 *
 *   size_class / class_size  how a request is rounded up to a block size (PyOpenCL's bin
 *                            layout: 64-byte steps up to 1 KiB, then 16 classes per power of
 *                            two), so the waste is below 64 bytes up to 1 KiB, at most 1/16
 *                            above;
 *   AllocationCounters       current, peak and total bytes and allocations (RMM's statistics
 *                            figures), counted once for the pool and StatisticsAdaptor;
 *   Block                    one upstream allocation a pool hands out again and again;
 *   Record                   the storage of svmkit.Allocation and the common case of its
 *                            free(): a pooled block with no export, no open map and no
 *                            recorded command goes straight back to its pool's ready list;
 *   BlockCache               a pool's lock, its ready blocks by size class and its byte
 *                            figures; take() hands out a ready block of the exact class as a
 *                            new Allocation, give() takes one back.
 *
 * Everything else (validation of first-seen sizes, best fit across classes, blocks waiting
 * for events, growth, out-of-memory recovery) stays in Python (svmkit/resources/pool.py and
 * _freelist.py), which the fast paths call whenever they do not apply.
 *
 * Locking.  BlockCache's lock guards its ready lists, byte figures and counters; Python
 * takes it with `with cache:`.  Nothing that can run Python code (a garbage collection, a
 * finaliser) happens while C holds it: the ready lists are plain C arrays, objects are
 * created only after the lock is released.  The module relies on the GIL for the rest (it
 * does not declare free-threading support).
 *
 * Fork.  A forked child's pools of the parent must not be used there (svmkit.driver.fork):
 * every fast path checks that its cache was created in the current process generation and
 * otherwise defers to Python, which raises.
 */
#include "_cpool.h"

unsigned long generation = 0; /* bumped in a forked child (next_generation) */

PyObject *str_free;      /* "_free": Allocation's Python free (every other case) */
PyObject *str_finalize;  /* "_finalize": Allocation's Python finaliser */
PyObject *str_allocate;  /* "_allocate_slow": the pool's Python allocate */
PyObject *str_release;   /* "_release_block": the pool's Python release upstream */
PyObject *str_ptr, *str_nbytes, *str_u8, *str_context, *str_policy;

/* ---------------------------------------------------------------- size classes -------- */

#define GRANULE 64
#define SMALL_CLASSES 16 /* classes 1..16: 64 B .. 1 KiB in steps of 64 B */
#define MANTISSA_BITS 4  /* 16 classes per power of two above 1 KiB */
#define FIRST_EXP 11     /* classes 17..32 cover (1 KiB, 2 KiB] */
#define MAX_REQUEST (PY_SSIZE_T_MAX / 2 + 1) /* 2**62 on 64-bit builds */

static int
bit_length(unsigned long long x)
{
    int n = 0;
    while (x) {
        x >>= 1;
        n++;
    }
    return n;
}

/* The class (>= 1) whose blocks hold n bytes (1 <= n <= MAX_REQUEST). */
Py_ssize_t
size_class(Py_ssize_t n)
{
    if (n <= SMALL_CLASSES * GRANULE)
        return n <= GRANULE ? 1 : (n + GRANULE - 1) / GRANULE;
    int exp = bit_length((unsigned long long)(n - 1)); /* 2**(exp-1) < n <= 2**exp */
    int shift = exp - 1 - MANTISSA_BITS;
    Py_ssize_t mantissa = (n + ((Py_ssize_t)1 << shift) - 1) >> shift; /* in (16, 32] */
    return 16 * (exp - FIRST_EXP) + mantissa;
}

/* Bytes in every block of class cls (>= 1). */
Py_ssize_t
class_size(Py_ssize_t cls)
{
    if (cls <= SMALL_CLASSES)
        return cls * GRANULE;
    Py_ssize_t exp = FIRST_EXP + (cls - 17) / 16;
    Py_ssize_t mantissa = cls - 16 * (exp - FIRST_EXP);
    return mantissa << (exp - 1 - MANTISSA_BITS);
}

static PyObject *
py_size_class(PyObject *mod, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > MAX_REQUEST) {
        PyErr_Format(PyExc_ValueError, "size_class takes 1 <= nbytes <= 2**62, got %zd", n);
        return NULL;
    }
    return PyLong_FromSsize_t(size_class(n));
}

static PyObject *
py_class_size(PyObject *mod, PyObject *arg)
{
    Py_ssize_t cls = PyLong_AsSsize_t(arg);
    if (cls == -1 && PyErr_Occurred())
        return NULL;
    if (cls < 1 || cls > size_class(MAX_REQUEST)) {
        PyErr_Format(PyExc_ValueError, "no size class %zd", cls);
        return NULL;
    }
    return PyLong_FromSsize_t(class_size(cls));
}

/* ---------------------------------------------------------------- counters ------------ */


void
counters_taken(Counters *c, Py_ssize_t n)
{
    c->current_bytes += n;
    if (c->current_bytes > c->peak_bytes)
        c->peak_bytes = c->current_bytes;
    c->current_allocations += 1;
    if (c->current_allocations > c->peak_allocations)
        c->peak_allocations = c->current_allocations;
    c->total_bytes += n;
    c->total_allocations += 1;
}

void
counters_returned(Counters *c, Py_ssize_t n)
{
    c->current_bytes -= n;
    c->current_allocations -= 1;
}

static PyObject *
Counters_taken(Counters *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    counters_taken(self, n);
    Py_RETURN_NONE;
}

static PyObject *
Counters_returned(Counters *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    counters_returned(self, n);
    Py_RETURN_NONE;
}

static PyObject *
Counters_snapshot(Counters *self, PyObject *unused)
{
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n}", "current_bytes", self->current_bytes,
                         "peak_bytes", self->peak_bytes, "total_bytes", self->total_bytes,
                         "current_allocations", self->current_allocations,
                         "peak_allocations", self->peak_allocations, "total_allocations",
                         self->total_allocations);
}

static PyMethodDef Counters_methods[] = {
    {"taken", (PyCFunction)Counters_taken, METH_O,
     "taken(nbytes): count an allocation of nbytes handed out."},
    {"returned", (PyCFunction)Counters_returned, METH_O,
     "returned(nbytes): count an allocation of nbytes given back."},
    {"snapshot", (PyCFunction)Counters_snapshot, METH_NOARGS,
     "The six figures as a dict (take it under the lock that guards updates)."},
    {NULL}};

static PyMemberDef Counters_members[] = {
    {"current_bytes", T_PYSSIZET, offsetof(Counters, current_bytes), READONLY, NULL},
    {"peak_bytes", T_PYSSIZET, offsetof(Counters, peak_bytes), READONLY, NULL},
    {"total_bytes", T_PYSSIZET, offsetof(Counters, total_bytes), READONLY, NULL},
    {"current_allocations", T_PYSSIZET, offsetof(Counters, current_allocations), READONLY, NULL},
    {"peak_allocations", T_PYSSIZET, offsetof(Counters, peak_allocations), READONLY, NULL},
    {"total_allocations", T_PYSSIZET, offsetof(Counters, total_allocations), READONLY, NULL},
    {NULL}};

static PyTypeObject CountersType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "svmkit.resources._cpool.AllocationCounters",
    .tp_basicsize = sizeof(Counters),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Current, peak and total bytes and allocations (the caller serialises updates).",
    .tp_new = PyType_GenericNew,
    .tp_methods = Counters_methods,
    .tp_members = Counters_members,
};

/* ---------------------------------------------------------------- Block --------------- */



static int
Block_init(Block *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"cls", "upstream", NULL};
    Py_ssize_t cls;
    PyObject *upstream;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nO:Block", names, &cls, &upstream))
        return -1;
    PyObject *ptr = PyObject_GetAttr(upstream, str_ptr);
    PyObject *nbytes = ptr ? PyObject_GetAttr(upstream, str_nbytes) : NULL;
    PyObject *u8 = nbytes ? PyObject_GetAttr(upstream, str_u8) : NULL;
    PyObject *memo = u8 ? PyDict_New() : NULL;
    Py_ssize_t size = memo ? PyLong_AsSsize_t(nbytes) : -1;
    Py_XDECREF(nbytes);
    if (!memo || (size == -1 && PyErr_Occurred())) {
        Py_XDECREF(ptr);
        Py_XDECREF(u8);
        Py_XDECREF(memo);
        return -1;
    }
    self->cls = cls;
    self->size = size;
    Py_XSETREF(self->ptr, ptr);
    Py_INCREF(upstream);
    Py_XSETREF(self->upstream, upstream);
    Py_INCREF(u8);
    Py_XSETREF(self->last_u8, u8);
    Py_XSETREF(self->u8, u8);
    self->last_nbytes = size;
    Py_XSETREF(self->memo, memo);
    return 0;
}

/* A uint8 view of the block's first n bytes (cached for repeats); a new reference. */
PyObject *
block_bytes_for(Block *self, Py_ssize_t n)
{
    if (self->last_nbytes != n) {
        PyObject *view = PySequence_GetSlice(self->u8, 0, n);
        if (!view)
            return NULL;
        Py_XSETREF(self->last_u8, view);
        self->last_nbytes = n;
    }
    Py_INCREF(self->last_u8);
    return self->last_u8;
}

static PyObject *
Block_bytes_for(Block *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n > self->size) {
        PyErr_Format(PyExc_ValueError, "a %zd-byte block has no view of %zd bytes", self->size,
                     n);
        return NULL;
    }
    return block_bytes_for(self, n);
}

static PyObject *
Block_repr(Block *self)
{
    return PyUnicode_FromFormat("<Block class %zd %zd B at %R>", self->cls, self->size,
                                self->ptr ? self->ptr : Py_None);
}

static int
Block_traverse(Block *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ptr);
    Py_VISIT(self->upstream);
    Py_VISIT(self->u8);
    Py_VISIT(self->last_u8);
    Py_VISIT(self->memo);
    return 0;
}

static int
Block_clear(Block *self)
{
    Py_CLEAR(self->ptr);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->u8);
    Py_CLEAR(self->last_u8);
    Py_CLEAR(self->memo);
    return 0;
}

static void
Block_dealloc(Block *self)
{
    PyObject_GC_UnTrack(self);
    Block_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Block_methods[] = {
    {"bytes_for", (PyCFunction)Block_bytes_for, METH_O,
     "bytes_for(nbytes): a uint8 view of the block's first nbytes bytes (cached for "
     "repeats)."},
    {NULL}};

static PyMemberDef Block_members[] = {
    {"cls", T_PYSSIZET, offsetof(Block, cls), READONLY, "size class (0: never cached)"},
    {"size", T_PYSSIZET, offsetof(Block, size), READONLY, "bytes of the upstream allocation"},
    {"ptr", T_OBJECT, offsetof(Block, ptr), READONLY, "address"},
    {"upstream", T_OBJECT, offsetof(Block, upstream), READONLY, "the upstream Allocation"},
    {"u8", T_OBJECT, offsetof(Block, u8), READONLY, "uint8 view of every byte"},
    {"memo", T_OBJECT, offsetof(Block, memo), READONLY,
     "per-block cache that outlives each hand-out (the array layer's typed views)"},
    {NULL}};

PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "svmkit.resources._cpool.Block",
    .tp_basicsize = sizeof(Block),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Block(cls, upstream): one upstream allocation a pool hands out again and again.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Block_init,
    .tp_dealloc = (destructor)Block_dealloc,
    .tp_traverse = (traverseproc)Block_traverse,
    .tp_clear = (inquiry)Block_clear,
    .tp_repr = (reprfunc)Block_repr,
    .tp_methods = Block_methods,
    .tp_members = Block_members,
};

/* ---------------------------------------------------------------- BlockCache ---------- */




static PyTypeObject BlockCacheType;



void
cache_lock(BlockCache *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

void
cache_unlock(BlockCache *self)
{
    PyThread_release_lock(self->lock);
}

/* Push a block (stealing the reference) on class cls's ready list; -1 on no memory.  Never
 * runs Python code (PyMem_Realloc does not collect), so it may run under the lock. */
int
cache_push_ready(BlockCache *self, Block *block)
{
    if (!cache_pools(self, block->cls))
        return -1; /* (an unpooled block is never listed) */
    Stack *s = &self->ready[block->cls];
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? 2 * s->cap : 8;
        Block **items = PyMem_Realloc(s->items, cap * sizeof(Block *));
        if (!items)
            return -1;
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = block;
    self->ready_bytes += block->size;
    self->ready_blocks += 1;
    return 0;
}

/* Pop the most recently pushed ready block of class cls (a new reference), or NULL. */
static Block *
cache_pop_ready(BlockCache *self, Py_ssize_t cls)
{
    if (!cache_pools(self, cls))
        return NULL;
    Stack *s = &self->ready[cls];
    if (!s->n)
        return NULL;
    Block *block = s->items[--s->n];
    self->ready_bytes -= block->size;
    self->ready_blocks -= 1;
    return block;
}

/* The pool (borrowed: alive while its weak reference resolves), or NULL once it is gone. */
/* Best fit for class cls, scanning classes start .. cls + LOOKAHEAD: the first (smallest)
 * class with a ready block gives its most recent one (a new reference).  NULL with *poll
 * set to a class whose pending blocks must be polled first (by Python, which calls back
 * with start = that class + 1), or NULL with *poll = 0: nothing cached fits. */
static Block *
cache_best_fit(BlockCache *self, Py_ssize_t cls, Py_ssize_t start, Py_ssize_t *poll)
{
    Py_ssize_t stop = cls + LOOKAHEAD < self->nclasses ? cls + LOOKAHEAD + 1 : self->nclasses;
    *poll = 0;
    for (Py_ssize_t c = start < 1 ? 1 : start; c < stop; c++) {
        Block *block = cache_pop_ready(self, c);
        if (block)
            return block;
        if (self->ready[c].pending) {
            *poll = c;
            return NULL;
        }
    }
    return NULL;
}

/* The pool (a new reference), or NULL once it is gone. */
PyObject *
cache_owner(BlockCache *self)
{
    if (!self->owner_ref)
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *owner;
    if (PyWeakref_GetRef(self->owner_ref, &owner) <= 0) {
        PyErr_Clear();
        return NULL;
    }
    return owner;
#else
    PyObject *owner = PyWeakref_GetObject(self->owner_ref);
    return owner == Py_None ? NULL : Py_NewRef(owner);
#endif
}

/* Whether the cache is usable (initialised, not cleared by the collector); else an error. */
static int
cache_usable(BlockCache *self)
{
    if (!self->ready || !self->counts || !self->owner_ref || !self->lock) {
        PyErr_SetString(PyExc_RuntimeError, "this BlockCache is not initialised");
        return 0;
    }
    return 1;
}


static int
BlockCache_init(BlockCache *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"owner", "record_type", "max_alloc", "max_cached_bytes", NULL};
    PyObject *owner, *record_type, *max_cached = Py_None;
    Py_ssize_t max_alloc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOn|O:BlockCache", names, &owner, &record_type,
                                     &max_alloc, &max_cached))
        return -1;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "BlockCache is initialised once");
        return -1;
    }
    if (max_alloc < 1 || max_alloc > MAX_REQUEST) {
        PyErr_Format(PyExc_ValueError, "max_alloc must be in 1 .. 2**62, got %zd", max_alloc);
        return -1;
    }
    if (max_cached == Py_None) {
        self->max_cached = -1;
    } else {
        self->max_cached = PyLong_AsSsize_t(max_cached);
        if (self->max_cached == -1 && PyErr_Occurred())
            return -1;
        if (self->max_cached < 0) {
            PyErr_SetString(PyExc_ValueError, "max_cached_bytes must be None or >= 0");
            return -1;
        }
    }
    if (!PyType_Check(record_type) ||
        !PyType_IsSubtype((PyTypeObject *)record_type, &RecordType)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a subtype of Record");
        return -1;
    }
    Py_ssize_t top = size_class(max_alloc);
    if (class_size(top) > max_alloc)
        top -= 1; /* classes whose blocks exceed max_alloc are never pooled */
    self->nclasses = top + 1;
    self->ready = PyMem_Calloc(self->nclasses, sizeof(Stack));
    self->lock = PyThread_allocate_lock();
    self->counts = PyObject_New(Counters, &CountersType);
    self->owner_ref = PyWeakref_NewRef(owner, NULL);
    self->context = PyObject_GetAttr(owner, str_context);
    self->policy = self->context ? PyObject_GetAttr(owner, str_policy) : NULL;
    if (!self->ready || !self->lock || !self->counts || !self->owner_ref || !self->policy) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    self->counts->current_bytes = self->counts->peak_bytes = self->counts->total_bytes = 0;
    self->counts->current_allocations = self->counts->peak_allocations = 0;
    self->counts->total_allocations = 0;
    Py_INCREF(record_type);
    self->record_type = record_type;
    self->max_alloc = max_alloc;
    self->generation = generation;
    return 0;
}

/* The common case of an allocation: a ready block of the request's own class. */
/* The common case of an allocation: a ready block of the request's class or up to
 * LOOKAHEAD classes larger. */
static PyObject *
BlockCache_take(BlockCache *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!cache_usable(self))
        return NULL;
    PyObject *owner = cache_owner(self); /* held across the hand-out (it may collect) */
    if (!owner) {
        PyErr_SetString(PyExc_ReferenceError, "the pool of this cache is gone");
        return NULL;
    }
    if (nargs >= 1 && !kwnames && self->generation == generation && PyLong_CheckExact(args[0]) &&
        (nargs == 1 || (nargs == 2 && PyLong_CheckExact(args[1]) &&
                        PyLong_AsLong(args[1]) == 0 && !PyErr_Occurred()))) {
        PyObject *nbytes = args[0];
        Py_ssize_t n = PyLong_AsSsize_t(nbytes);
        if (n > 0 && n <= self->max_alloc) {
            Py_ssize_t cls = size_class(n);
            if (cls < self->nclasses) {
                Py_ssize_t poll;
                cache_lock(self);
                Block *block = cache_best_fit(self, cls, cls, &poll);
                if (block)
                    counters_taken(self->counts, n);
                cache_unlock(self);
                if (block) {
                    PyObject *rec = cache_hand_out(self, owner, block, nbytes, n);
                    Py_DECREF(owner);
                    return rec;
                }
            }
        }
    }
    PyErr_Clear();
    /* Every other case: the pool's Python path (validation, best fit, pending, growth). */
    PyObject *stack[8];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 7) {
        Py_DECREF(owner);
        PyErr_SetString(PyExc_TypeError, "allocate(nbytes, alignment=0): too many arguments");
        return NULL;
    }
    stack[0] = owner;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        stack[i + 1] = args[i];
    PyObject *result = PyObject_VectorcallMethod(str_allocate, stack, (size_t)(nargs + 1), kwnames);
    Py_DECREF(owner);
    return result;
}

/* Count an allocation of n bytes of block given back, and keep the block if it is pooled
 * and fits under max_cached_bytes: on the ready list when no command may still use it,
 * else counted as pending (the caller lists it with its events before it releases the
 * lock).  1: kept, 0: the caller releases it upstream.  The caller holds the lock. */
int
cache_give_locked(BlockCache *self, Block *block, Py_ssize_t n, int pending)
{
    counters_returned(self->counts, n);
    int keep = cache_pools(self, block->cls) &&
               (self->max_cached < 0 ||
                self->ready_bytes + self->pending_bytes + block->size <= self->max_cached);
    if (keep && pending) {
        self->pending_bytes += block->size;
        self->ready[block->cls].pending += 1;
    }
    else if (keep) {
        Py_INCREF(block);
        if (cache_push_ready(self, block) < 0) {
            Py_DECREF(block); /* (not the last reference: the caller holds one) */
            keep = 0;
        }
    }
    return keep;
}

static PyObject *
BlockCache_give(BlockCache *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!cache_usable(self))
        return NULL;
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &BlockType)) {
        PyErr_SetString(PyExc_TypeError, "give(block, nbytes, pending)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    int pending = PyObject_IsTrue(args[2]);
    if ((n == -1 && PyErr_Occurred()) || pending < 0)
        return NULL;
    return PyBool_FromLong(cache_give_locked(self, (Block *)args[0], n, pending));
}

static PyObject *
BlockCache_best_fit(BlockCache *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!cache_usable(self))
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "best_fit(cls, start)");
        return NULL;
    }
    Py_ssize_t cls = PyLong_AsSsize_t(args[0]);
    Py_ssize_t start = cls == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    if (!cache_pools(self, cls))
        Py_RETURN_NONE;
    Py_ssize_t poll;
    Block *block = cache_best_fit(self, cls, start, &poll);
    if (block)
        return (PyObject *)block;
    if (poll)
        return PyLong_FromSsize_t(poll);
    Py_RETURN_NONE;
}

/* arg as a Block of a class pooled here, or NULL with an error naming ``what``. */
static Block *
pooled_block(BlockCache *self, PyObject *arg, const char *what)
{
    if (!cache_usable(self))
        return NULL;
    if (!PyObject_TypeCheck(arg, &BlockType)) {
        PyErr_Format(PyExc_TypeError, "%s takes a Block", what);
        return NULL;
    }
    Block *block = (Block *)arg;
    if (!cache_pools(self, block->cls)) {
        PyErr_Format(PyExc_ValueError, "class %zd is not pooled here", block->cls);
        return NULL;
    }
    return block;
}

static PyObject *
BlockCache_unpend(BlockCache *self, PyObject *arg)
{
    Block *block = pooled_block(self, arg, "unpend");
    if (!block)
        return NULL;
    if (!self->ready[block->cls].pending) {
        PyErr_Format(PyExc_ValueError, "no pending block of class %zd", block->cls);
        return NULL;
    }
    self->ready[block->cls].pending -= 1;
    self->pending_bytes -= block->size;
    Py_RETURN_NONE;
}

static PyObject *
BlockCache_push_ready(BlockCache *self, PyObject *arg)
{
    Block *block = pooled_block(self, arg, "push_ready");
    if (!block)
        return NULL;
    Py_INCREF(block);
    if (cache_push_ready(self, block) < 0) {
        Py_DECREF(block);
        return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

static PyObject *
BlockCache_take_ready(BlockCache *self, PyObject *unused)
{
    if (!cache_usable(self))
        return NULL;
    PyObject *out = PyList_New(self->ready_blocks);
    if (!out)
        return NULL;
    Py_ssize_t i = 0;
    for (Py_ssize_t c = 1; c < self->nclasses; c++) {
        Stack *s = &self->ready[c];
        for (Py_ssize_t k = 0; k < s->n; k++)
            PyList_SET_ITEM(out, i++, (PyObject *)s->items[k]); /* references move */
        s->n = 0;
    }
    self->ready_bytes = self->ready_blocks = 0;
    return out;
}

static PyObject *
BlockCache_hand_out(BlockCache *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!cache_usable(self))
        return NULL;
    if (nargs != 2 || !PyObject_TypeCheck(args[0], &BlockType) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "hand_out(block, nbytes: int)");
        return NULL;
    }
    Block *block = (Block *)args[0];
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (!block->ptr || !block->u8 || !block->memo || n < 1 || n > block->size) {
        PyErr_SetString(PyExc_ValueError, "hand_out needs an initialised block of >= nbytes");
        return NULL;
    }
    PyObject *owner = cache_owner(self);
    if (!owner) {
        PyErr_SetString(PyExc_ReferenceError, "the pool of this cache is gone");
        return NULL;
    }
    Py_INCREF(block);
    PyObject *rec = cache_hand_out(self, owner, block, args[1], n);
    Py_DECREF(owner);
    return rec;
}

static PyObject *
BlockCache_enter(BlockCache *self, PyObject *unused)
{
    if (!cache_usable(self))
        return NULL;
    cache_lock(self);
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *
BlockCache_exit(BlockCache *self, PyObject *args)
{
    if (!cache_usable(self))
        return NULL;
    cache_unlock(self);
    Py_RETURN_FALSE;
}

static PyObject *
BlockCache_get_max_cached(BlockCache *self, void *closure)
{
    if (self->max_cached < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(self->max_cached);
}

static int
BlockCache_set_max_cached(BlockCache *self, PyObject *value, void *closure)
{
    if (!value || value == Py_None) {
        self->max_cached = -1;
        return 0;
    }
    Py_ssize_t v = PyLong_AsSsize_t(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0) {
        PyErr_SetString(PyExc_ValueError, "max_cached_bytes must be None or >= 0");
        return -1;
    }
    self->max_cached = v;
    return 0;
}

static PyObject *
BlockCache_get_counts(BlockCache *self, void *closure)
{
    if (!cache_usable(self))
        return NULL;
    Py_INCREF(self->counts);
    return (PyObject *)self->counts;
}

static int
BlockCache_traverse(BlockCache *self, visitproc visit, void *arg)
{
    if (self->ready)
        for (Py_ssize_t c = 1; c < self->nclasses; c++)
            for (Py_ssize_t k = 0; k < self->ready[c].n; k++)
                Py_VISIT(self->ready[c].items[k]);
    Py_VISIT(self->counts);
    Py_VISIT(self->owner_ref);
    Py_VISIT(self->record_type);
    Py_VISIT(self->context);
    Py_VISIT(self->policy);
    return 0;
}

static int
BlockCache_clear(BlockCache *self)
{
    if (self->ready) {
        for (Py_ssize_t c = 1; c < self->nclasses; c++) {
            Stack *s = &self->ready[c];
            while (s->n) {
                Block *block = s->items[--s->n];
                Py_DECREF(block);
            }
        }
        self->ready_bytes = self->ready_blocks = 0;
    }
    Py_CLEAR(self->counts);
    Py_CLEAR(self->owner_ref);
    Py_CLEAR(self->record_type);
    Py_CLEAR(self->context);
    Py_CLEAR(self->policy);
    return 0;
}

static void
BlockCache_dealloc(BlockCache *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    BlockCache_clear(self);
    if (self->ready) {
        for (Py_ssize_t c = 1; c < self->nclasses; c++)
            PyMem_Free(self->ready[c].items);
        PyMem_Free(self->ready);
    }
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef BlockCache_methods[] = {
    {"take", (PyCFunction)(void (*)(void))BlockCache_take, METH_FASTCALL | METH_KEYWORDS,
     "take(nbytes, alignment=0): an Allocation of nbytes; a ready block of the exact class "
     "when there is one, else the pool's _allocate_slow(nbytes, alignment)."},
    {"give", (PyCFunction)(void (*)(void))BlockCache_give, METH_FASTCALL,
     "give(block, nbytes, pending): count nbytes given back and keep the block if it is "
     "pooled and fits under max_cached_bytes (ready, or counted as pending: list it with its "
     "events before releasing the lock); False: the caller releases it upstream (hold the "
     "lock)."},
    {"best_fit", (PyCFunction)(void (*)(void))BlockCache_best_fit, METH_FASTCALL,
     "best_fit(cls, start): scanning classes start .. cls + 4, the most recent ready block "
     "of the first class that has one; or the first class on the way whose pending blocks "
     "must be polled first (an int: call again with start = it + 1); or None (hold the "
     "lock)."},
    {"unpend", (PyCFunction)BlockCache_unpend, METH_O,
     "unpend(block): a pending block left the pending list (hold the lock)."},
    {"push_ready", (PyCFunction)BlockCache_push_ready, METH_O,
     "push_ready(block): list a block as ready for reuse (hold the lock)."},
    {"take_ready", (PyCFunction)BlockCache_take_ready, METH_NOARGS,
     "take_ready(): remove and return every ready block (hold the lock)."},
    {"hand_out", (PyCFunction)(void (*)(void))BlockCache_hand_out, METH_FASTCALL,
     "hand_out(block, nbytes): a new Allocation of the block's first nbytes bytes (each "
     "hand-out gets a new record, so arrays of an earlier user raise UseAfterFreeError)."},
    {"__enter__", (PyCFunction)BlockCache_enter, METH_NOARGS, "Take the lock."},
    {"__exit__", (PyCFunction)BlockCache_exit, METH_VARARGS, "Release the lock."},
    {NULL}};

static PyMemberDef BlockCache_members[] = {
    {"ready_bytes", T_PYSSIZET, offsetof(BlockCache, ready_bytes), READONLY,
     "bytes of ready blocks"},
    {"ready_blocks", T_PYSSIZET, offsetof(BlockCache, ready_blocks), READONLY,
     "number of ready blocks"},
    {"pending_bytes", T_PYSSIZET, offsetof(BlockCache, pending_bytes), READONLY,
     "bytes of blocks waiting for events (listed by the Python free list)"},
    {"nclasses", T_PYSSIZET, offsetof(BlockCache, nclasses), READONLY,
     "classes 1 .. nclasses - 1 are pooled"},
    {NULL}};

static PyGetSetDef BlockCache_getset[] = {
    {"max_cached_bytes", (getter)BlockCache_get_max_cached, (setter)BlockCache_set_max_cached,
     "most bytes kept cached (None: no limit)", NULL},
    {"counts", (getter)BlockCache_get_counts, NULL, "the AllocationCounters of the pool", NULL},
    {NULL}};

static PyTypeObject BlockCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "svmkit.resources._cpool.BlockCache",
    .tp_basicsize = sizeof(BlockCache),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "BlockCache(owner, record_type, max_alloc, max_cached_bytes=None): a pool's "
              "lock, ready blocks by size class, byte figures and counters.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BlockCache_init,
    .tp_dealloc = (destructor)BlockCache_dealloc,
    .tp_traverse = (traverseproc)BlockCache_traverse,
    .tp_clear = (inquiry)BlockCache_clear,
    .tp_weaklistoffset = offsetof(BlockCache, weakreflist),
    .tp_methods = BlockCache_methods,
    .tp_members = BlockCache_members,
    .tp_getset = BlockCache_getset,
};

/* ---------------------------------------------------------------- module -------------- */

static PyObject *
py_next_generation(PyObject *mod, PyObject *unused)
{
    generation += 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"size_class", py_size_class, METH_O,
     "size_class(nbytes): the class (>= 1) whose blocks hold nbytes (>= 1) with bounded "
     "waste: 64-byte steps up to 1 KiB, then 16 classes per power of two."},
    {"class_size", py_class_size, METH_O, "class_size(cls): bytes in every block of class cls."},
    {"next_generation", py_next_generation, METH_NOARGS,
     "In a forked child: every cache made before the fork defers to Python (which refuses "
     "the parent's pools there)."},
    {NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_cpool",
    "The pool's hot path in C: size classes, counters, blocks, the allocation record and "
    "the ready-block cache.",
    -1, module_methods};

PyMODINIT_FUNC
PyInit__cpool(void)
{
#define INTERN(var, s)                                                                         \
    if (!(var = PyUnicode_InternFromString(s)))                                                \
        return NULL;
    INTERN(str_free, "_free")
    INTERN(str_finalize, "_finalize")
    INTERN(str_allocate, "_allocate_slow")
    INTERN(str_release, "_release_block")
    INTERN(str_ptr, "ptr")
    INTERN(str_nbytes, "nbytes")
    INTERN(str_u8, "u8")
    INTERN(str_context, "context")
    INTERN(str_policy, "policy")
#undef INTERN
    if (PyType_Ready(&CountersType) < 0 || PyType_Ready(&BlockType) < 0 ||
        PyType_Ready(&BlockCacheType) < 0 || PyType_Ready(&RecordType) < 0)
        return NULL;
    if (numpy_handler_init() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddFunctions(m, numpy_handler_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "AllocationCounters", (PyObject *)&CountersType) < 0 ||
        PyModule_AddObjectRef(m, "Block", (PyObject *)&BlockType) < 0 ||
        PyModule_AddObjectRef(m, "BlockCache", (PyObject *)&BlockCacheType) < 0 ||
        PyModule_AddObjectRef(m, "Record", (PyObject *)&RecordType) < 0 ||
        PyModule_AddIntConstant(m, "GRANULE", GRANULE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
