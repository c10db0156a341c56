/* svmkit.resources._cpool: what the extension's files share.  One extension, three files:
 * _cpool.c (size classes, counters, blocks, block caches, the module), _record.c (the
 * allocation record) and _numpy_handler.c (NumPy's data-memory handler over svmkit
 * resources).  Every symbol here is hidden: nothing outside the extension links to it. */
#ifndef SVMKIT_CPOOL_H
#define SVMKIT_CPOOL_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>

#pragma GCC visibility push(hidden)

extern unsigned long generation; /* bumped in a forked child (next_generation) */
extern PyObject *str_free, *str_finalize, *str_allocate, *str_release;
extern PyObject *str_ptr, *str_nbytes, *str_u8, *str_context, *str_policy;

typedef struct {
    PyObject_HEAD
    Py_ssize_t current_bytes, peak_bytes, total_bytes;
    Py_ssize_t current_allocations, peak_allocations, total_allocations;
} Counters;

typedef struct {
    PyObject_HEAD
    Py_ssize_t cls;         /* size class; 0: too large to pool (never cached) */
    Py_ssize_t size;        /* bytes of the upstream allocation */
    PyObject *ptr;          /* its address (an int) */
    PyObject *upstream;     /* the upstream Allocation */
    PyObject *u8;           /* uint8 NumPy view of every byte */
    PyObject *last_u8;      /* uint8 view of the first last_nbytes bytes */
    Py_ssize_t last_nbytes;
    PyObject *memo;         /* per-block cache that outlives each hand-out (typed views) */
} Block;

/* A block waiting for events: it is handed out again only once every one completed. */
typedef struct {
    Block *block;       /* a reference */
    PyObject *events;   /* a reference: the non-empty list of events it waits for */
} Pending;

/* One size class of a cache: its ready blocks (a stack: the most recently used memory, the
 * warmest, goes out first) and its pending blocks (oldest first). */
typedef struct {
    Block **ready;
    Py_ssize_t nready, ready_cap;
    Pending *pending;
    Py_ssize_t npending, pending_cap;
} SizeClass;

#define LOOKAHEAD 4  /* a request may take a block up to 4 classes larger (~25 % more) */
#define POLL_LIMIT 8 /* pending blocks of one class polled per miss (bounds a miss's cost) */
#define UNPOOLED 0   /* the class of a size whose class would exceed max_alloc: never cached */

/* A pool's whole state, under its lock: blocks by size class (ready and pending), the byte
 * and block figures of both, the blocks held from upstream, the counters. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    SizeClass *classes;      /* classes[cls] for classes 1 .. nclasses - 1 (the pooled ones) */
    Py_ssize_t nclasses;
    Py_ssize_t ready_bytes, ready_blocks, pending_bytes, pending_blocks;
    Py_ssize_t upstream_bytes, upstream_blocks, upstream_allocations;
    Py_ssize_t max_cached;   /* -1: no limit */
    Py_ssize_t max_alloc;    /* largest request served here */
    unsigned long generation;
    Counters *counts;
    PyObject *held;          /* dict: address -> upstream Allocation of every block held */
    PyObject *is_complete;   /* is_complete(event) -> bool: the driver's status query */
    PyObject *owner_ref;     /* weak reference to the pool (records' resource) */
    PyObject *record_type;   /* svmkit.Allocation */
    PyObject *context, *policy;
    PyObject *weakreflist;
} BlockCache;

typedef struct {
    PyObject_HEAD
    PyObject *resource, *context, *policy, *ptr, *nbytes, *block, *u8, *events, *map_state,
        *memo, *exports;
    PyObject *cache; /* the BlockCache that handed it out (free's common case), or NULL */
    PyObject *weakreflist;
    char freed;
} Record;

extern PyTypeObject BlockType, RecordType;

Py_ssize_t size_class(Py_ssize_t n);
Py_ssize_t class_size(Py_ssize_t cls);
void counters_taken(Counters *c, Py_ssize_t n);
void counters_returned(Counters *c, Py_ssize_t n);
PyObject *block_bytes_for(Block *self, Py_ssize_t n);
void cache_lock(BlockCache *self);
void cache_unlock(BlockCache *self);
PyObject *cache_owner(BlockCache *self);
/* Count n bytes of block given back and keep the block (ready, or pending on events: a list,
 * or NULL) when it is pooled and fits under max_cached_bytes; 1: kept, 0: it left the pool
 * (the caller releases it upstream).  The caller holds the lock. */
int cache_give_locked(BlockCache *self, Block *block, Py_ssize_t n, PyObject *events);
/* A new Allocation for n bytes of block (stealing the block reference). */
PyObject *cache_hand_out(BlockCache *self, PyObject *owner, Block *block, PyObject *nbytes,
                         Py_ssize_t n);
/* Allocation.free()'s common case (else Allocation._free); a new reference or NULL. */
PyObject *Record_free(Record *self, PyObject *unused);

/* _numpy_handler.c: the module's NEP 49 functions and their set-up (NumPy's C API). */
extern PyMethodDef numpy_handler_methods[];
int numpy_handler_init(void);

/* Whether class cls is pooled by cache (has ready and pending lists). */
static inline int
cache_pools(BlockCache *self, Py_ssize_t cls)
{
    return cls >= 1 && cls < self->nclasses;
}

/* The raised exception, cleared (NULL: none); restore_exception(e) raises it again (NULL:
 * nothing).  Python 3.12's PyErr_GetRaisedException / PyErr_SetRaisedException. */
static inline PyObject *
fetch_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!type)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static inline void
restore_exception(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    if (exc)
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

#pragma GCC visibility pop
#endif
