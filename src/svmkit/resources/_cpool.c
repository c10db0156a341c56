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
 *   BlockCache               a pool's whole state under its lock: ready blocks by size class
 *                            (LIFO), pending blocks with the events they wait for, the blocks
 *                            held from upstream, every figure and the counters, and which
 *                            sizes are pooled; take() hands out a ready block (best fit over
 *                            4 more classes) as a new Allocation, take_cached() also polls
 *                            pending blocks, adopt() holds a new upstream block, give() takes
 *                            one back (ready, or pending on its events).
 *
 * What stays in Python (svmkit/resources/pool.py) holds no state: validation of sizes and
 * alignments, calls upstream, out-of-memory recovery, releases upstream after events.  The
 * driver's event status query is Python's too (svmkit.driver.calls): the cache calls the
 * is_complete callable it was given, outside its lock.
 *
 * Locking.  BlockCache's lock guards everything in it; svmkit never runs Python code while
 * holding it (see the BlockCache section), so a garbage collection, a finaliser or NumPy's
 * free (_numpy_handler.c, through Record_free) never finds it held by its own thread.
 * Python may take it with `with cache:` (tests do).  The module relies on the GIL for the
 * rest (it does not declare free-threading support).
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

/* The six figures as a dict (made by the caller after any lock is released). */
static PyObject *
counters_dict(const Counters *c)
{
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n}", "current_bytes", c->current_bytes,
                         "peak_bytes", c->peak_bytes, "total_bytes", c->total_bytes,
                         "current_allocations", c->current_allocations, "peak_allocations",
                         c->peak_allocations, "total_allocations", c->total_allocations);
}

static PyObject *
Counters_snapshot(Counters *self, PyObject *unused)
{
    return counters_dict(self);
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
/*
 * A pool's whole state lives here, under one lock, with one owner: its ready blocks, its
 * pending blocks (each with the events it waits for), the byte and block figures of both,
 * the blocks it holds from upstream and their figures, its counters, and the classes it
 * pools (a size whose class would round up beyond max_alloc is UNPOOLED: served by a block of
 * exactly its size, never cached).  Python (svmkit/resources/pool.py) asks; it keeps none of
 * it.
 *
 * A pending block becomes ready once every event it waits for completed.  Completion is
 * polled with the is_complete callable given at construction (the driver's status query,
 * svmkit.driver.calls.event_complete), never under the lock: take_cached copies the oldest
 * POLL_LIMIT entries of a class, releases the lock to poll them and takes it again to move
 * the completed ones to the ready list.
 *
 * svmkit never runs Python code while holding the lock: the lists are C arrays (PyMem, which
 * never collects), the held blocks are a dict keyed by int addresses (hashing and comparing
 * ints runs no Python code), no reference that could be the last is dropped (what leaves the
 * cache is dropped after the lock), and Python objects (records, lists, dicts, exceptions)
 * are made only once it is released.  So no collection, finaliser or NumPy free (the NEP 49
 * handler, Record_free) can find the lock held by its own thread.
 */

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

/* The class that serves a request of n bytes here: >= 1 pooled, UNPOOLED for a size whose
 * class would round up beyond max_alloc, -1 for n outside 1 .. max_alloc (zero, negative, or
 * beyond the smallest CL_DEVICE_MAX_MEM_ALLOC_SIZE: no block serves it).  The one place that
 * decides whether a size is pooled. */
static Py_ssize_t
cache_class_of(BlockCache *self, Py_ssize_t n)
{
    if (n < 1 || n > self->max_alloc)
        return -1;
    Py_ssize_t cls = size_class(n);
    return cache_pools(self, cls) ? cls : UNPOOLED;
}

/* Grow an array of items of `size` bytes to hold one more; -1 on no memory (no error set). */
static int
grow_for_one(void **items, Py_ssize_t *cap, Py_ssize_t n, size_t size)
{
    if (n < *cap)
        return 0;
    Py_ssize_t more = *cap ? 2 * *cap : 8;
    void *bigger = PyMem_Realloc(*items, (size_t)more * size);
    if (!bigger)
        return -1;
    *items = bigger;
    *cap = more;
    return 0;
}

/* List block as ready (a new reference taken); -1 on no memory.  Under the lock. */
static int
cache_push_ready(BlockCache *self, Block *block)
{
    SizeClass *c = &self->classes[block->cls];
    if (grow_for_one((void **)&c->ready, &c->ready_cap, c->nready, sizeof(Block *)) < 0)
        return -1;
    c->ready[c->nready++] = (Block *)Py_NewRef(block);
    self->ready_bytes += block->size;
    self->ready_blocks += 1;
    return 0;
}

/* List block as waiting for events (new references taken); -1 on no memory.  Under the lock. */
static int
cache_push_pending(BlockCache *self, Block *block, PyObject *events)
{
    SizeClass *c = &self->classes[block->cls];
    if (grow_for_one((void **)&c->pending, &c->pending_cap, c->npending, sizeof(Pending)) < 0)
        return -1;
    c->pending[c->npending++] = (Pending){(Block *)Py_NewRef(block), Py_NewRef(events)};
    self->pending_bytes += block->size;
    self->pending_blocks += 1;
    return 0;
}

/* Pop the most recently pushed ready block of class cls (the list's reference), or NULL. */
static Block *
cache_pop_ready(BlockCache *self, Py_ssize_t cls)
{
    SizeClass *c = &self->classes[cls];
    if (!c->nready)
        return NULL;
    Block *block = c->ready[--c->nready];
    self->ready_bytes -= block->size;
    self->ready_blocks -= 1;
    return block;
}

/* Remove pending entry i of class cls (its references move to the caller).  Under the lock. */
static Pending
cache_remove_pending(BlockCache *self, Py_ssize_t cls, Py_ssize_t i)
{
    SizeClass *c = &self->classes[cls];
    Pending gone = c->pending[i];
    memmove(&c->pending[i], &c->pending[i + 1], (size_t)(c->npending - i - 1) * sizeof(Pending));
    c->npending -= 1;
    self->pending_bytes -= gone.block->size;
    self->pending_blocks -= 1;
    return gone;
}

/* Whether block is one this cache holds from upstream (1/0).  Under the lock. */
static int
cache_holds_locked(BlockCache *self, Block *block)
{
    if (!block->ptr || !block->upstream)
        return 0;
    PyObject *upstream = PyDict_GetItemWithError(self->held, block->ptr);
    return upstream && upstream == block->upstream;
}

/* Hold block, just had from upstream: 0, 1 when it is held already, -1 on no memory (no
 * error set).  Under the lock. */
static int
cache_adopt_locked(BlockCache *self, Block *block)
{
    if (PyDict_GetItemWithError(self->held, block->ptr))
        return 1;
    if (PyDict_SetItem(self->held, block->ptr, block->upstream) < 0) {
        PyErr_Clear();
        return -1;
    }
    self->upstream_bytes += block->size;
    self->upstream_blocks += 1;
    self->upstream_allocations += 1;
    return 0;
}

/* block leaves the pool for upstream (the caller releases it there).  Under the lock: the
 * dict's references it drops are not the last (the block holds its address and upstream). */
static void
cache_disown_locked(BlockCache *self, Block *block)
{
    if (!cache_holds_locked(self, block))
        return;
    if (PyDict_DelItem(self->held, block->ptr) == 0) {
        self->upstream_bytes -= block->size;
        self->upstream_blocks -= 1;
    }
}

/* Best fit for class cls, scanning classes start .. cls + LOOKAHEAD: the first (smallest)
 * class with a ready block gives its most recent one (the list's reference).  NULL with
 * *poll set to a class whose pending blocks must be polled first, or NULL with *poll = 0:
 * nothing cached fits.  Under the lock. */
static Block *
cache_best_fit(BlockCache *self, Py_ssize_t cls, Py_ssize_t start, Py_ssize_t *poll)
{
    Py_ssize_t stop = cls + LOOKAHEAD < self->nclasses ? cls + LOOKAHEAD + 1 : self->nclasses;
    *poll = 0;
    for (Py_ssize_t c = start < 1 ? 1 : start; c < stop; c++) {
        Block *block = cache_pop_ready(self, c);
        if (block)
            return block;
        if (self->classes[c].npending) {
            *poll = c;
            return NULL;
        }
    }
    return NULL;
}

/* The block a hand-out of n bytes gets, counted as handed out: the one place a hand-out is
 * counted.  fresh: a block just adopted from upstream; else the best fit among the ready
 * blocks (cache_best_fit, its *poll included).  A reference, or NULL.  Under the lock. */
static Block *
cache_claim_locked(BlockCache *self, Py_ssize_t n, Block *fresh, Py_ssize_t cls, Py_ssize_t start,
                   Py_ssize_t *poll)
{
    Block *block = fresh ? fresh : cache_best_fit(self, cls, start, poll);
    if (block)
        counters_taken(self->counts, n);
    return block;
}

int
cache_give_locked(BlockCache *self, Block *block, Py_ssize_t n, PyObject *events)
{
    counters_returned(self->counts, n);
    int keep = cache_pools(self, block->cls) &&
               (self->max_cached < 0 ||
                self->ready_bytes + self->pending_bytes + block->size <= self->max_cached);
    if (keep)
        keep = (events ? cache_push_pending(self, block, events) : cache_push_ready(self, block)) == 0;
    if (!keep)
        cache_disown_locked(self, block);
    return keep;
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

/* The pool (a new reference), or NULL with ReferenceError once it is gone. */
static PyObject *
cache_owner_or_error(BlockCache *self)
{
    PyObject *owner = cache_owner(self);
    if (!owner)
        PyErr_SetString(PyExc_ReferenceError, "the pool of this cache is gone");
    return owner;
}

/* Whether the cache is usable (initialised, not cleared by the collector); else an error. */
static int
cache_usable(BlockCache *self)
{
    if (!self->classes || !self->counts || !self->owner_ref || !self->lock || !self->held ||
        !self->is_complete) {
        PyErr_SetString(PyExc_RuntimeError, "this BlockCache is not initialised");
        return 0;
    }
    return 1;
}

/* arg as a Block, or NULL with a TypeError naming the method. */
static Block *
block_arg(PyObject *arg, const char *what)
{
    if (!PyObject_TypeCheck(arg, &BlockType)) {
        PyErr_Format(PyExc_TypeError, "%s takes a Block, got %R", what, arg);
        return NULL;
    }
    return (Block *)arg;
}

static int
BlockCache_init(BlockCache *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"owner", "record_type", "max_alloc", "is_complete",
                            "max_cached_bytes", NULL};
    PyObject *owner, *record_type, *is_complete, *max_cached = Py_None;
    Py_ssize_t max_alloc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOnO|O:BlockCache", names, &owner, &record_type,
                                     &max_alloc, &is_complete, &max_cached))
        return -1;
    if (self->classes) {
        PyErr_SetString(PyExc_RuntimeError, "BlockCache is initialised once");
        return -1;
    }
    if (max_alloc < 1 || max_alloc > MAX_REQUEST) {
        PyErr_Format(PyExc_ValueError, "max_alloc must be in 1 .. 2**62, got %zd", max_alloc);
        return -1;
    }
    if (!PyCallable_Check(is_complete)) {
        PyErr_SetString(PyExc_TypeError, "is_complete must be a callable (event -> bool)");
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
    self->classes = PyMem_Calloc(self->nclasses, sizeof(SizeClass));
    self->lock = PyThread_allocate_lock();
    self->counts = PyObject_New(Counters, &CountersType);
    self->held = PyDict_New();
    self->owner_ref = PyWeakref_NewRef(owner, NULL);
    self->context = PyObject_GetAttr(owner, str_context);
    self->policy = self->context ? PyObject_GetAttr(owner, str_policy) : NULL;
    if (!self->classes || !self->lock || !self->counts || !self->held || !self->owner_ref ||
        !self->policy) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    self->counts->current_bytes = self->counts->peak_bytes = self->counts->total_bytes = 0;
    self->counts->current_allocations = self->counts->peak_allocations = 0;
    self->counts->total_allocations = 0;
    self->record_type = Py_NewRef(record_type);
    self->is_complete = Py_NewRef(is_complete);
    self->max_alloc = max_alloc;
    self->generation = generation;
    return 0;
}

/* The common case of an allocation: a ready block of the request's class or up to
 * LOOKAHEAD classes larger, met before any class with pending blocks. */
static PyObject *
BlockCache_take(BlockCache *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!cache_usable(self))
        return NULL;
    PyObject *owner = cache_owner_or_error(self); /* held across the hand-out (it may collect) */
    if (!owner)
        return NULL;
    if (nargs >= 1 && !kwnames && self->generation == generation && PyLong_CheckExact(args[0]) &&
        (nargs == 1 || (nargs == 2 && PyLong_CheckExact(args[1]) &&
                        PyLong_AsLong(args[1]) == 0 && !PyErr_Occurred()))) {
        PyObject *nbytes = args[0];
        Py_ssize_t n = PyLong_AsSsize_t(nbytes);
        Py_ssize_t cls = n == -1 ? -1 : cache_class_of(self, n);
        if (cls >= 1) {
            Py_ssize_t poll;
            cache_lock(self);
            Block *block = cache_claim_locked(self, n, NULL, cls, cls, &poll);
            cache_unlock(self);
            if (block) {
                PyObject *rec = cache_hand_out(self, owner, block, nbytes, n);
                Py_DECREF(owner);
                return rec;
            }
        }
    }
    PyErr_Clear();
    /* Every other case: the pool's Python path (validation, pending blocks, growth). */
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

/* A request's size in bytes (an int >= 0), or -1 with an error. */
static Py_ssize_t
nbytes_arg(PyObject *arg, const char *what)
{
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s takes nbytes: int, got %R", what, arg);
        return -1;
    }
    return PyLong_AsSsize_t(arg);
}

/* Whether every event of a pending entry completed (1/0), -1 with is_complete's error.
 * Runs Python code: never under the lock. */
static int
cache_events_complete(BlockCache *self, PyObject *events)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = Py_NewRef(PyList_GET_ITEM(events, i));
        PyObject *r = PyObject_CallOneArg(self->is_complete, event);
        Py_DECREF(event);
        int done = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (done <= 0)
            return done;
    }
    return 1;
}

/* Move the pending entry of class cls that lists block to the ready list: its events list (a
 * reference, for the caller to drop after the lock), or NULL when the entry is gone (taken
 * meanwhile) or no memory was had (it stays pending).  Under the lock. */
static PyObject *
cache_promote_locked(BlockCache *self, Py_ssize_t cls, Block *block)
{
    SizeClass *c = &self->classes[cls];
    for (Py_ssize_t i = 0; i < c->npending; i++) {
        if (c->pending[i].block != block)
            continue;
        if (cache_push_ready(self, block) < 0)
            return NULL;
        Pending gone = cache_remove_pending(self, cls, i);
        Py_DECREF(gone.block); /* (not the last reference: the ready list holds one) */
        return gone.events;
    }
    return NULL;
}

/* Poll the oldest POLL_LIMIT pending entries of class cls outside the lock; the completed
 * ones become ready.  1: some did, 0: none, -1 with is_complete's error. */
static int
cache_poll_class(BlockCache *self, Py_ssize_t cls)
{
    Pending polled[POLL_LIMIT];
    PyObject *done_events[POLL_LIMIT];
    int done[POLL_LIMIT];
    Py_ssize_t k = 0, ndone = 0;
    cache_lock(self);
    SizeClass *c = &self->classes[cls];
    for (; k < c->npending && k < POLL_LIMIT; k++)
        polled[k] = (Pending){(Block *)Py_NewRef(c->pending[k].block),
                              Py_NewRef(c->pending[k].events)};
    cache_unlock(self);
    int any = 0, failed = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        done[i] = failed ? 0 : cache_events_complete(self, polled[i].events);
        if (done[i] < 0) {
            failed = 1;
            done[i] = 0;
        }
        any |= done[i];
    }
    if (any) {
        cache_lock(self);
        for (Py_ssize_t i = 0; i < k; i++) {
            PyObject *events = done[i] ? cache_promote_locked(self, cls, polled[i].block) : NULL;
            if (events)
                done_events[ndone++] = events;
        }
        cache_unlock(self);
    }
    while (ndone)
        Py_DECREF(done_events[--ndone]);
    for (Py_ssize_t i = 0; i < k; i++) {
        Py_DECREF(polled[i].block);
        Py_DECREF(polled[i].events);
    }
    return failed ? -1 : any;
}

static PyObject *
BlockCache_take_cached(BlockCache *self, PyObject *arg)
{
    if (!cache_usable(self))
        return NULL;
    Py_ssize_t n = nbytes_arg(arg, "take_cached");
    if (n == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t cls = cache_class_of(self, n);
    if (cls < 1)
        Py_RETURN_NONE;
    PyObject *owner = cache_owner_or_error(self);
    if (!owner)
        return NULL;
    for (Py_ssize_t start = cls;;) {
        Py_ssize_t poll;
        cache_lock(self);
        Block *block = cache_claim_locked(self, n, NULL, cls, start, &poll);
        cache_unlock(self);
        if (block || !poll) {
            PyObject *rec = block ? cache_hand_out(self, owner, block, arg, n) : Py_NewRef(Py_None);
            Py_DECREF(owner);
            return rec;
        }
        int promoted = cache_poll_class(self, poll);
        if (promoted < 0) {
            Py_DECREF(owner);
            return NULL;
        }
        start = promoted ? poll : poll + 1; /* (a promoted block is taken on the next scan) */
    }
}

static PyObject *
BlockCache_adopt(BlockCache *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!cache_usable(self))
        return NULL;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "adopt(upstream, nbytes)");
        return NULL;
    }
    Py_ssize_t n = nbytes_arg(args[1], "adopt");
    if (n == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t cls = cache_class_of(self, n);
    if (cls < 0) {
        PyErr_Format(PyExc_ValueError, "no block of this cache serves %zd bytes", n);
        return NULL;
    }
    Py_ssize_t size = cls == UNPOOLED ? n : class_size(cls);
    Block *block = (Block *)PyObject_CallFunction((PyObject *)&BlockType, "nO", cls, args[0]);
    if (!block)
        return NULL;
    if (block->size < size) {
        PyErr_Format(PyExc_ValueError, "a %zd-byte upstream allocation cannot hold a %zd-byte "
                     "block", block->size, size);
        Py_DECREF(block);
        return NULL;
    }
    PyObject *owner = cache_owner_or_error(self);
    if (!owner) {
        Py_DECREF(block);
        return NULL;
    }
    Py_ssize_t unused;
    cache_lock(self);
    int adopted = cache_adopt_locked(self, block);
    if (adopted == 0)
        cache_claim_locked(self, n, block, cls, cls, &unused);
    cache_unlock(self);
    if (adopted != 0) {
        if (adopted > 0)
            PyErr_Format(PyExc_ValueError, "the block at %R is held by this pool already",
                         block->ptr);
        else
            PyErr_NoMemory();
        Py_DECREF(owner);
        Py_DECREF(block);
        return NULL;
    }
    PyObject *rec = cache_hand_out(self, owner, block, args[1], n);
    Py_DECREF(owner);
    return rec;
}

static PyObject *
BlockCache_give(BlockCache *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!cache_usable(self))
        return NULL;
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &BlockType) ||
        !(args[2] == Py_None || PyList_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "give(block, nbytes, events: list | None)");
        return NULL;
    }
    Block *block = (Block *)args[0];
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    PyObject *events = args[2] != Py_None && PyList_GET_SIZE(args[2]) ? args[2] : NULL;
    cache_lock(self);
    int held = cache_holds_locked(self, block);
    int kept = held ? cache_give_locked(self, block, n, events) : 0;
    cache_unlock(self);
    if (!held) {
        PyErr_Format(PyExc_ValueError, "%R is not held by this pool", (PyObject *)block);
        return NULL;
    }
    return PyBool_FromLong(kept);
}

static PyObject *
BlockCache_pending_events(BlockCache *self, PyObject *unused)
{
    if (!cache_usable(self))
        return NULL;
    PyObject **events = NULL;
    Py_ssize_t total = 0, k = 0;
    cache_lock(self);
    for (Py_ssize_t cls = 1; cls < self->nclasses; cls++)
        for (Py_ssize_t i = 0; i < self->classes[cls].npending; i++)
            total += PyList_GET_SIZE(self->classes[cls].pending[i].events);
    if (total && !(events = PyMem_Malloc((size_t)total * sizeof(PyObject *)))) {
        cache_unlock(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t cls = 1; cls < self->nclasses; cls++)
        for (Py_ssize_t i = 0; i < self->classes[cls].npending; i++) {
            PyObject *list = self->classes[cls].pending[i].events;
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(list); j++)
                events[k++] = Py_NewRef(PyList_GET_ITEM(list, j));
        }
    cache_unlock(self);
    PyObject *out = PyList_New(total);
    for (Py_ssize_t i = 0; i < total; i++) {
        if (out)
            PyList_SET_ITEM(out, i, events[i]); /* the reference moves */
        else
            Py_DECREF(events[i]);
    }
    PyMem_Free(events);
    return out;
}

static PyObject *
BlockCache_take_all(BlockCache *self, PyObject *unused)
{
    if (!cache_usable(self))
        return NULL;
    cache_lock(self);
    Py_ssize_t total = self->ready_blocks + self->pending_blocks, k = 0;
    Pending *all = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(Pending));
    if (!all) {
        cache_unlock(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t cls = 1; cls < self->nclasses; cls++) {
        SizeClass *c = &self->classes[cls];
        for (Py_ssize_t i = 0; i < c->nready; i++)
            all[k++] = (Pending){c->ready[i], NULL}; /* references move */
        for (Py_ssize_t i = 0; i < c->npending; i++)
            all[k++] = c->pending[i];
        c->nready = c->npending = 0;
    }
    self->ready_bytes = self->ready_blocks = self->pending_bytes = self->pending_blocks = 0;
    for (Py_ssize_t i = 0; i < total; i++)
        cache_disown_locked(self, all[i].block);
    cache_unlock(self);
    PyObject *out = PyList_New(total);
    Py_ssize_t made = 0;
    for (; out && made < total; made++) {
        PyObject *events = all[made].events ? all[made].events : PyList_New(0);
        PyObject *pair = events ? PyTuple_Pack(2, (PyObject *)all[made].block, events) : NULL;
        if (!pair)
            break;
        Py_DECREF(all[made].block);
        Py_DECREF(events);
        PyList_SET_ITEM(out, made, pair);
    }
    PyMem_Free(all);
    if (made < total)
        return NULL; /* no memory: every block is leaked (the list too) rather than released
                      * while commands may still use it */
    return out;
}

static PyObject *
BlockCache_holds(BlockCache *self, PyObject *arg)
{
    if (!cache_usable(self))
        return NULL;
    if (!PyObject_TypeCheck(arg, &BlockType))
        Py_RETURN_FALSE;
    cache_lock(self);
    int holds = cache_holds_locked(self, (Block *)arg);
    cache_unlock(self);
    return PyBool_FromLong(holds);
}

static PyObject *
BlockCache_block_size(BlockCache *self, PyObject *arg)
{
    if (!cache_usable(self))
        return NULL;
    Py_ssize_t n = nbytes_arg(arg, "block_size");
    if (n == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear(); /* (beyond any size: no block serves it) */
    }
    Py_ssize_t cls = cache_class_of(self, n);
    if (cls < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(cls == UNPOOLED ? n : class_size(cls));
}

static PyObject *
BlockCache_figures(BlockCache *self, PyObject *unused)
{
    if (!cache_usable(self))
        return NULL;
    cache_lock(self);
    Py_ssize_t in_use = self->counts->current_bytes, upstream = self->upstream_bytes;
    Py_ssize_t cached = self->ready_bytes + self->pending_bytes, pending = self->pending_bytes;
    Py_ssize_t blocks = self->upstream_blocks;
    Py_ssize_t cached_blocks = self->ready_blocks + self->pending_blocks;
    Py_ssize_t allocations = self->upstream_allocations;
    cache_unlock(self);
    Py_ssize_t block_bytes = upstream - cached;
    return Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n,s:n}", "in_use_bytes", in_use,
                         "in_use_block_bytes", block_bytes, "fragmented_bytes",
                         block_bytes - in_use, "cached_bytes", cached, "pending_bytes", pending,
                         "upstream_bytes", upstream, "upstream_blocks", blocks,
                         "live_allocations", blocks - cached_blocks, "cached_blocks",
                         cached_blocks, "upstream_allocations", allocations);
}

static PyObject *
BlockCache_statistics(BlockCache *self, PyObject *unused)
{
    if (!cache_usable(self))
        return NULL;
    Counters figures;
    cache_lock(self);
    memcpy(&figures, self->counts, sizeof figures); /* (the six figures, read as one) */
    cache_unlock(self);
    return counters_dict(&figures);
}

/* The figures recounted from the lists, under the lock. */
typedef struct {
    Py_ssize_t ready_bytes, ready_blocks, pending_bytes, pending_blocks;
    Py_ssize_t misfiled, not_held, no_events, held;
} Recount;

static PyObject *
BlockCache_check(BlockCache *self, PyObject *unused)
{
    if (!cache_usable(self))
        return NULL;
    Recount r = {0};
    cache_lock(self);
    for (Py_ssize_t cls = 1; cls < self->nclasses; cls++) {
        SizeClass *c = &self->classes[cls];
        for (Py_ssize_t i = 0; i < c->nready + c->npending; i++) {
            int ready = i < c->nready;
            Block *block = ready ? c->ready[i] : c->pending[i - c->nready].block;
            *(ready ? &r.ready_bytes : &r.pending_bytes) += block->size;
            *(ready ? &r.ready_blocks : &r.pending_blocks) += 1;
            r.misfiled += block->cls != cls;
            r.not_held += !cache_holds_locked(self, block);
            if (!ready) {
                PyObject *events = c->pending[i - c->nready].events;
                r.no_events += !PyList_Check(events) || !PyList_GET_SIZE(events);
            }
        }
    }
    r.held = PyDict_GET_SIZE(self->held);
    Recount s = {self->ready_bytes, self->ready_blocks, self->pending_bytes,
                 self->pending_blocks};
    Py_ssize_t upstream_bytes = self->upstream_bytes, upstream_blocks = self->upstream_blocks;
    Py_ssize_t in_use_bytes = self->counts->current_bytes;
    Py_ssize_t in_use = self->counts->current_allocations;
    cache_unlock(self);
    Py_ssize_t cached = s.ready_bytes + s.pending_bytes;
    Py_ssize_t live = upstream_blocks - s.ready_blocks - s.pending_blocks;
    const char *broken =
        r.ready_bytes != s.ready_bytes || r.ready_blocks != s.ready_blocks
            ? "the ready figures are not the sum of the ready lists"
        : r.pending_bytes != s.pending_bytes || r.pending_blocks != s.pending_blocks
            ? "the pending figures are not the sum of the pending lists"
        : r.misfiled ? "a listed block is in another class's list"
        : r.not_held ? "a listed block is not held from upstream"
        : r.no_events ? "a pending block waits for no events"
        : r.held != upstream_blocks ? "upstream_blocks is not the number of blocks held"
        : in_use != live ? "the allocations counted are not the blocks in use"
        : in_use_bytes < 0 || in_use_bytes > upstream_bytes - cached
            ? "the bytes counted in use exceed the bytes of the blocks in use"
            : NULL;
    if (broken) {
        PyErr_Format(PyExc_RuntimeError,
                     "pool state broken: %s (listed ready %zd B in %zd, pending %zd B in %zd; "
                     "figures ready %zd B in %zd, pending %zd B in %zd; held %zd, upstream %zd B "
                     "in %zd; counted %zd B in %zd allocations)",
                     broken, r.ready_bytes, r.ready_blocks, r.pending_bytes, r.pending_blocks,
                     s.ready_bytes, s.ready_blocks, s.pending_bytes, s.pending_blocks, r.held,
                     upstream_bytes, upstream_blocks, in_use_bytes, in_use);
        return NULL;
    }
    Py_RETURN_NONE;
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
    return Py_NewRef((PyObject *)self->counts);
}

static PyObject *
BlockCache_get_cached_bytes(BlockCache *self, void *closure)
{
    return PyLong_FromSsize_t(self->ready_bytes + self->pending_bytes);
}

static int
BlockCache_traverse(BlockCache *self, visitproc visit, void *arg)
{
    if (self->classes)
        for (Py_ssize_t cls = 1; cls < self->nclasses; cls++) {
            SizeClass *c = &self->classes[cls];
            for (Py_ssize_t i = 0; i < c->nready; i++)
                Py_VISIT(c->ready[i]);
            for (Py_ssize_t i = 0; i < c->npending; i++) {
                Py_VISIT(c->pending[i].block);
                Py_VISIT(c->pending[i].events);
            }
        }
    Py_VISIT(self->counts);
    Py_VISIT(self->held);
    Py_VISIT(self->is_complete);
    Py_VISIT(self->owner_ref);
    Py_VISIT(self->record_type);
    Py_VISIT(self->context);
    Py_VISIT(self->policy);
    return 0;
}

static int
BlockCache_clear(BlockCache *self)
{
    if (self->classes) {
        for (Py_ssize_t cls = 1; cls < self->nclasses; cls++) {
            SizeClass *c = &self->classes[cls];
            while (c->nready) {
                Block *block = c->ready[--c->nready];
                Py_DECREF(block);
            }
            while (c->npending) {
                Pending gone = c->pending[--c->npending];
                Py_DECREF(gone.block);
                Py_DECREF(gone.events);
            }
        }
        self->ready_bytes = self->ready_blocks = self->pending_bytes = self->pending_blocks = 0;
    }
    Py_CLEAR(self->counts);
    Py_CLEAR(self->held);
    Py_CLEAR(self->is_complete);
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
    if (self->classes) {
        for (Py_ssize_t cls = 1; cls < self->nclasses; cls++) {
            PyMem_Free(self->classes[cls].ready);
            PyMem_Free(self->classes[cls].pending);
        }
        PyMem_Free(self->classes);
    }
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef BlockCache_methods[] = {
    {"take", (PyCFunction)(void (*)(void))BlockCache_take, METH_FASTCALL | METH_KEYWORDS,
     "take(nbytes, alignment=0): an Allocation of nbytes; a ready block of its class or up to "
     "4 classes larger when one comes before any class with pending blocks, else the pool's "
     "_allocate_slow(nbytes, alignment)."},
    {"take_cached", (PyCFunction)BlockCache_take_cached, METH_O,
     "take_cached(nbytes): an Allocation of a cached block that fits nbytes (best fit over its "
     "class and the next 4: a ready block, or a pending one whose events all completed, at "
     "most 8 polled per class), or None (nothing fits, or the size is not pooled)."},
    {"adopt", (PyCFunction)(void (*)(void))BlockCache_adopt, METH_FASTCALL,
     "adopt(upstream, nbytes): hold a new block over the upstream Allocation and hand out an "
     "Allocation of its first nbytes bytes."},
    {"give", (PyCFunction)(void (*)(void))BlockCache_give, METH_FASTCALL,
     "give(block, nbytes, events): count nbytes given back and keep the block if it is "
     "pooled and fits under max_cached_bytes: ready, or pending until every event of the "
     "list completed (the cache keeps the list).  False: it left the pool; release it "
     "upstream after the events."},
    {"pending_events", (PyCFunction)BlockCache_pending_events, METH_NOARGS,
     "pending_events(): every event the pending blocks wait for."},
    {"take_all", (PyCFunction)BlockCache_take_all, METH_NOARGS,
     "take_all(): remove every cached block from the pool: a list of (block, the events it "
     "still waits for); release each upstream after its events."},
    {"holds", (PyCFunction)BlockCache_holds, METH_O,
     "holds(block): whether block is one the pool holds from upstream."},
    {"block_size", (PyCFunction)BlockCache_block_size, METH_O,
     "block_size(nbytes): bytes of the block that serves a request of nbytes (its class's "
     "size, or nbytes itself for a size too large to pool), or None when nbytes is not in "
     "1 .. max_alloc."},
    {"figures", (PyCFunction)BlockCache_figures, METH_NOARGS,
     "figures(): the pool's byte and block figures as one consistent dict (PoolResource.info)."},
    {"statistics", (PyCFunction)BlockCache_statistics, METH_NOARGS,
     "statistics(): the counters' six figures as one consistent dict."},
    {"check", (PyCFunction)BlockCache_check, METH_NOARGS,
     "check(): recount the figures from the lists; RuntimeError naming the first that "
     "disagrees (listed sizes vs ready_bytes / pending_bytes, blocks held vs upstream_blocks, "
     "allocations counted vs blocks in use)."},
    {"__enter__", (PyCFunction)BlockCache_enter, METH_NOARGS,
     "Take the lock (svmkit itself never runs Python code holding it)."},
    {"__exit__", (PyCFunction)BlockCache_exit, METH_VARARGS, "Release the lock."},
    {NULL}};

static PyMemberDef BlockCache_members[] = {
    {"ready_bytes", T_PYSSIZET, offsetof(BlockCache, ready_bytes), READONLY,
     "bytes of ready blocks"},
    {"ready_blocks", T_PYSSIZET, offsetof(BlockCache, ready_blocks), READONLY,
     "number of ready blocks"},
    {"pending_bytes", T_PYSSIZET, offsetof(BlockCache, pending_bytes), READONLY,
     "bytes of blocks waiting for events"},
    {"pending_blocks", T_PYSSIZET, offsetof(BlockCache, pending_blocks), READONLY,
     "number of blocks waiting for events"},
    {"upstream_bytes", T_PYSSIZET, offsetof(BlockCache, upstream_bytes), READONLY,
     "bytes of every block held from upstream"},
    {"upstream_blocks", T_PYSSIZET, offsetof(BlockCache, upstream_blocks), READONLY,
     "blocks held from upstream"},
    {"upstream_allocations", T_PYSSIZET, offsetof(BlockCache, upstream_allocations), READONLY,
     "blocks ever adopted from upstream"},
    {"nclasses", T_PYSSIZET, offsetof(BlockCache, nclasses), READONLY,
     "classes 1 .. nclasses - 1 are pooled"},
    {"max_alloc", T_PYSSIZET, offsetof(BlockCache, max_alloc), READONLY,
     "largest request served (the smallest CL_DEVICE_MAX_MEM_ALLOC_SIZE)"},
    {NULL}};

static PyGetSetDef BlockCache_getset[] = {
    {"max_cached_bytes", (getter)BlockCache_get_max_cached, (setter)BlockCache_set_max_cached,
     "most bytes kept cached (None: no limit)", NULL},
    {"counts", (getter)BlockCache_get_counts, NULL, "the AllocationCounters of the pool", NULL},
    {"cached_bytes", (getter)BlockCache_get_cached_bytes, NULL,
     "bytes of cached blocks, ready and pending", NULL},
    {NULL}};

static PyTypeObject BlockCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "svmkit.resources._cpool.BlockCache",
    .tp_basicsize = sizeof(BlockCache),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "BlockCache(owner, record_type, max_alloc, is_complete, max_cached_bytes=None): "
              "a pool's whole state (lock, ready and pending blocks by size class, blocks "
              "held from upstream, figures, counters) and its allocation paths.",
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
