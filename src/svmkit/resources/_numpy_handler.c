/* svmkit.resources._cpool, NumPy's data-memory handler (NEP 49) over svmkit resources.
 *
 * `sk.numpy_allocator(resource)` installs a PyDataMem_Handler whose functions hand NumPy
 * the memory of svmkit allocations: every array NumPy creates inside it owns one
 * svmkit.Allocation of `resource` (or, for the default handler, of the current resource of
 * the default context, looked up at each allocation).  The allocation lives in one
 * process-wide table, address -> Allocation, which this file owns alone:
 *
 *   malloc   resource.allocate(n) (a pool's C fast path when it applies), the record listed
 *            under its address;
 *   calloc   the same, zeroed;
 *   realloc  a new allocation, the bytes copied, the old one freed (after recorded work:
 *            the copy reads what the device wrote);
 *   free     the record leaves the table and is freed: a pooled block with nothing recorded
 *            goes straight back to its pool's ready list (Record_free), one with recorded
 *            work waits in the pool's pending list, so free never blocks.  During a
 *            garbage collection (an array in a reference cycle) the free is handed to
 *            svmkit's release thread instead: the collection may have interrupted this
 *            thread while it held the pool's lock (the pool's Python code runs under it),
 *            which Record_free would take again: a deadlock (Allocation._finalize defers
 *            the same way).
 *
 * NumPy calls these functions with the GIL held (array creation, deallocation) and without
 * it (realloc in text-mode np.fromstring / np.fromfile): each takes the GIL first, and the
 * GIL guards the table.  Python code run inside (a pool's slow path, a garbage collection)
 * may allocate arrays itself: such nested requests get plain malloc memory (svmkit's own
 * temporaries never come from the handler, and no pool lock is taken twice).  So do
 * requests made during any garbage collection (a finaliser's arrays): the collection may
 * have interrupted svmkit's code holding a pool's lock.  free() tells the two apart by the
 * table.
 *
 * NEP 49 handlers are immortal (NumPy keeps a reference in every array it made): a handler
 * and its resource live for the process.  The size NumPy passes to free is a best guess:
 * the record's own size is used.  In a forked child, handlers made before the fork serve
 * plain malloc memory and never touch the parent's pools (the parent's blocks are leaked
 * there); after svmkit's exit hook (stop_numpy_handlers) every request is plain memory and
 * blocks freed later are left to the process's end.
 *
 * SYSTEM memory (fine-grain system SVM: any host allocation) comes from system_alloc here,
 * never from NumPy: posix_memalign, or mmap madvised for transparent huge pages above
 * 4 MiB as NumPy's default handler does.
 */
#include "_cpool.h"

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL svmkit_cpool_ARRAY_API
#include <numpy/arrayobject.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#pragma GCC visibility push(hidden)

#define HANDLER_NAME "svmkit"
#define HUGE_PAGE_THRESHOLD (4u << 20) /* NumPy's default madvises from 4 MiB */

/* ---------------------------------------------------------------- the address table --- */

/* Open addressing with linear probing; keys are block addresses (never 0), TOMBSTONE marks a
 * removed entry.  Guarded by the GIL. */
#define TOMBSTONE ((uintptr_t)1)

typedef struct {
    uintptr_t key;
    Record *record;   /* a strong reference */
    PyObject *pointer; /* its PyOpenCL SVM pointer, made at its first kernel use, or NULL */
} Slot;

static Slot *slots = NULL;
static size_t nslots = 0, nlive = 0, nused = 0; /* nused: live + tombstones */

static inline size_t
slot_hash(uintptr_t key)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull; /* Fibonacci hashing */
    return (size_t)(h >> 20);
}

static int
table_grow(void)
{
    size_t n = nslots ? (nlive * 4 > nslots ? nslots * 2 : nslots) : 1024;
    Slot *fresh = PyMem_RawCalloc(n, sizeof(Slot));
    if (!fresh)
        return -1;
    for (size_t i = 0; i < nslots; i++) {
        uintptr_t key = slots[i].key;
        if (key && key != TOMBSTONE) {
            size_t j = slot_hash(key) & (n - 1);
            while (fresh[j].key)
                j = (j + 1) & (n - 1);
            fresh[j] = slots[i];
        }
    }
    PyMem_RawFree(slots);
    slots = fresh;
    nslots = n;
    nused = nlive;
    return 0;
}

/* List record under key (a new address: never listed); steals the reference.  -1: no memory. */
static int
table_insert(uintptr_t key, Record *record)
{
    if ((nused + 1) * 4 > nslots * 3 && table_grow() < 0)
        return -1;
    size_t j = slot_hash(key) & (nslots - 1);
    while (slots[j].key && slots[j].key != TOMBSTONE)
        j = (j + 1) & (nslots - 1);
    if (!slots[j].key)
        nused++;
    slots[j].key = key;
    slots[j].record = record;
    slots[j].pointer = NULL;
    nlive++;
    return 0;
}

static Slot *
table_find(uintptr_t key)
{
    if (!nslots)
        return NULL;
    size_t j = slot_hash(key) & (nslots - 1);
    while (slots[j].key) {
        if (slots[j].key == key)
            return &slots[j];
        j = (j + 1) & (nslots - 1);
    }
    return NULL;
}

/* The record listed under key, unlisted (the reference moves to the caller), or NULL. */
static Record *
table_remove(uintptr_t key)
{
    Slot *slot = table_find(key);
    if (!slot)
        return NULL;
    Record *record = slot->record;
    slot->key = TOMBSTONE;
    slot->record = NULL;
    Py_CLEAR(slot->pointer); /* (a PyOpenCL object over the block's bytes: no Python runs) */
    nlive--;
    return record;
}

/* ---------------------------------------------------------------- handlers ------------ */

typedef struct {
    unsigned long generation; /* the process generation it was made in */
} HandlerState;

static int stopped = 0;          /* after svmkit's exit hook: plain memory only */
static int collecting = 0;       /* garbage collections in progress (gc.callbacks) */
static PyObject *free_later = NULL; /* (record) -> None: a free during a collection */
static _Thread_local int depth;  /* > 0: inside a handler call on this thread */

/* Which resource a request draws from.  `resource_var` (a context variable set with NumPy's
 * handler by sk.numpy_allocator(resource)) names it; None means the default: the current
 * resource of the default context, decided by the `svmkit_resources` context variable
 * (use_resource) and a version bumped whenever a process-wide default changes
 * (set_current_resource); the Python resolver runs only when one of them moved.  Nothing
 * here keeps a resource alive but the last one used (the context variables hold the
 * others), so no resource is immortal though NEP 49 handlers are. */
static PyObject *resource_var = NULL;       /* ContextVar: the resource, or None */
static PyObject *cached_resource = NULL;    /* the resource of cached_resource_allocate */
static PyObject *cached_resource_allocate = NULL;
static PyObject *default_resolver = NULL;   /* () -> resource.allocate */
static PyObject *selected_var = NULL;       /* the ContextVar of use_resource */
static PyObject *cached_selected = NULL;    /* its value when cached_allocate was resolved */
static PyObject *cached_allocate = NULL;
static unsigned long resources_version = 1, cached_version = 0;
static PyObject *str_allocate_method;       /* "allocate" */

static int
finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* Whether a request must get plain memory: stopped, a child's inherited handler, the
 * interpreter going down, a nested request, or one during a garbage collection (a
 * finaliser making an array: the collection may have interrupted a pool holding its lock
 * on this thread, which the pool's allocate would take again). */
static inline int
plain_only(HandlerState *state)
{
    return stopped || state->generation != generation || depth > 0 || collecting ||
           finalizing();
}

/* The allocate callable of the resource a request draws from now (a borrowed reference),
 * or NULL with an error set. */
static PyObject *
allocate_for(HandlerState *state)
{
    PyObject *resource = NULL;
    if (PyContextVar_Get(resource_var, NULL, &resource) < 0)
        return NULL;
    if (resource && resource != Py_None) {
        if (resource != cached_resource || !cached_resource_allocate) {
            PyObject *allocate = PyObject_GetAttr(resource, str_allocate_method);
            if (!allocate) {
                Py_DECREF(resource);
                return NULL;
            }
            Py_XSETREF(cached_resource_allocate, allocate);
            Py_XSETREF(cached_resource, Py_NewRef(resource));
        }
        Py_DECREF(resource);
        return cached_resource_allocate;
    }
    Py_XDECREF(resource);
    PyObject *selected = NULL;
    if (PyContextVar_Get(selected_var, NULL, &selected) < 0)
        return NULL;
    if (selected == cached_selected && cached_version == resources_version && cached_allocate) {
        Py_XDECREF(selected);
        return cached_allocate;
    }
    unsigned long version = resources_version;
    PyObject *allocate = PyObject_CallNoArgs(default_resolver);
    if (!allocate) {
        Py_XDECREF(selected);
        return NULL;
    }
    Py_XSETREF(cached_allocate, allocate);
    Py_XSETREF(cached_selected, selected);
    cached_version = version;
    return cached_allocate;
}

/* An allocation of n bytes listed in the table, or NULL (with no error set: NumPy raises
 * its own MemoryError, and the cause goes to the svmkit logger through the resolver...) */
static void *
handler_alloc_gil(HandlerState *state, size_t n, Record **out)
{
    if (n == 0)
        n = 1; /* NumPy allocates at least one byte; so does svmkit here */
    PyObject *allocate = allocate_for(state);
    if (!allocate)
        return NULL;
    PyObject *nbytes = PyLong_FromSize_t(n);
    if (!nbytes)
        return NULL;
    Py_INCREF(allocate); /* (the resolver may replace the cached one meanwhile) */
    PyObject *rec = PyObject_CallOneArg(allocate, nbytes);
    Py_DECREF(allocate);
    Py_DECREF(nbytes);
    if (!rec)
        return NULL;
    if (!PyObject_TypeCheck(rec, &RecordType)) {
        PyErr_Format(PyExc_TypeError, "a resource's allocate returned %R, not an Allocation", rec);
        Py_DECREF(rec);
        return NULL;
    }
    void *ptr = PyLong_AsVoidPtr(((Record *)rec)->ptr);
    if (!ptr) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_MemoryError, "an svmkit resource returned a NULL block");
        PyObject *r = Record_free((Record *)rec, NULL);
        Py_XDECREF(r);
        Py_DECREF(rec);
        return NULL;
    }
    if (table_insert((uintptr_t)ptr, (Record *)rec) < 0) {
        PyObject *r = Record_free((Record *)rec, NULL);
        Py_XDECREF(r);
        Py_DECREF(rec);
        PyErr_NoMemory();
        return NULL;
    }
    if (out)
        *out = (Record *)rec;
    return ptr;
}

/* Report an error raised inside a handler function (NumPy sees only NULL) and clear it. */
static void
report(const char *what)
{
    PyObject *exc = fetch_exception();
    if (!exc)
        return;
    static PyObject *logger = NULL;
    if (!logger) {
        PyObject *logging = PyImport_ImportModule("logging");
        logger = logging ? PyObject_CallMethod(logging, "getLogger", "s",
                                               "svmkit.resources.numpy_allocator")
                         : NULL;
        Py_XDECREF(logging);
    }
    PyObject *r = logger ? PyObject_CallMethod(logger, "warning", "ssO",
                                               "svmkit NumPy allocator: %s failed: %r", what, exc)
                         : NULL;
    if (!r)
        PyErr_Clear();
    Py_XDECREF(r);
    Py_DECREF(exc);
}

static void *
handler_malloc(void *ctx, size_t size)
{
    HandlerState *state = ctx;
    if (plain_only(state))
        return malloc(size ? size : 1);
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *exc = fetch_exception();
    depth++;
    void *ptr = handler_alloc_gil(state, size, NULL);
    depth--;
    if (!ptr)
        report("allocation");
    restore_exception(exc);
    PyGILState_Release(gil);
    return ptr;
}

static void *
handler_calloc(void *ctx, size_t nelem, size_t elsize)
{
    if (elsize && nelem > SIZE_MAX / elsize)
        return NULL;
    size_t n = nelem * elsize;
    HandlerState *state = ctx;
    if (plain_only(state))
        return calloc(n ? n : 1, 1);
    void *ptr = handler_malloc(ctx, n);
    if (ptr)
        memset(ptr, 0, n ? n : 1); /* (a reused block holds an earlier user's bytes) */
    return ptr;
}

/* Free a listed record's memory (the GIL held); every error is reported. */
static void
free_record(Record *record)
{
    PyObject *r = Record_free(record, NULL);
    if (!r)
        report("free");
    Py_XDECREF(r);
    Py_DECREF(record);
}

static void
handler_free(void *ctx, void *ptr, size_t size)
{
    if (!ptr)
        return;
    HandlerState *state = ctx;
    if (stopped || finalizing()) {
        /* Teardown: the table is read as it is (one thread runs), listed blocks are left to
         * the process's end, plain ones freed. */
        if (!table_find((uintptr_t)ptr))
            free(ptr);
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    Record *record = table_remove((uintptr_t)ptr);
    if (!record) {
        PyGILState_Release(gil);
        free(ptr); /* plain memory: a nested, forked-child or post-exit request */
        return;
    }
    if (state->generation != generation) {
        PyGILState_Release(gil); /* the parent's block: leaked, its pool never touched */
        return;
    }
    PyObject *exc = fetch_exception();
    depth++;
    if (collecting && free_later) {
        /* (no lock taken here: the release thread frees it) */
        PyObject *r = PyObject_CallOneArg(free_later, (PyObject *)record);
        if (!r)
            report("free");
        Py_XDECREF(r);
        Py_DECREF(record);
    }
    else
        free_record(record);
    depth--;
    restore_exception(exc);
    PyGILState_Release(gil);
}

static PyObject *str_wait_recorded; /* "wait_recorded": Allocation's wait for its work */

/* The bytes a listed record was asked for (-1 with an error set). */
static Py_ssize_t
record_nbytes(Record *record)
{
    return PyLong_AsSsize_t(record->nbytes);
}

static void *
handler_realloc(void *ctx, void *ptr, size_t new_size)
{
    if (!ptr)
        return handler_malloc(ctx, new_size);
    HandlerState *state = ctx;
    size_t n = new_size ? new_size : 1;
    if (stopped || finalizing()) {
        Slot *slot = table_find((uintptr_t)ptr);
        if (!slot)
            return realloc(ptr, n);
        Py_ssize_t old_n = record_nbytes(slot->record); /* (the exiting thread holds the GIL) */
        void *fresh = old_n >= 0 ? malloc(n) : NULL;  /* the old block stays listed, left */
        if (fresh)
            memcpy(fresh, ptr, (size_t)old_n < n ? (size_t)old_n : n);
        else
            PyErr_Clear();
        return fresh;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    Slot *slot = table_find((uintptr_t)ptr);
    if (!slot) {
        PyGILState_Release(gil);
        return realloc(ptr, n); /* plain memory */
    }
    PyObject *exc = fetch_exception();
    int child = state->generation != generation;
    int plain = plain_only(state);
    depth++;
    Record *old = slot->record;
    Py_INCREF(old);
    void *fresh = NULL;
    Py_ssize_t old_n = record_nbytes(old);
    /* The bytes are copied after the work recorded on them (a kernel may still write them);
     * a forked child never waits on the parent's events. */
    PyObject *waited = child ? Py_NewRef(Py_None)
                             : PyObject_CallMethodNoArgs((PyObject *)old, str_wait_recorded);
    if (waited && old_n >= 0) {
        fresh = plain ? malloc(n) : handler_alloc_gil(state, new_size, NULL);
        if (fresh) {
            memcpy(fresh, ptr, (size_t)old_n < n ? (size_t)old_n : n);
            Record *gone = table_remove((uintptr_t)ptr);
            if (gone && !child)
                free_record(gone);
            /* (a child leaks the parent's record: its pool is never touched there) */
        }
    }
    Py_XDECREF(waited);
    Py_DECREF(old);
    depth--;
    if (!fresh)
        report("reallocation");
    restore_exception(exc);
    PyGILState_Release(gil);
    return fresh;
}

/* ---------------------------------------------------------------- Python functions ---- */

static void
capsule_never_freed(PyObject *capsule)
{
    /* NEP 49 handlers are immortal; the module keeps every capsule it made. */
}

static PyObject *capsules = NULL; /* every handler capsule made (kept for the process) */

static PyObject *
py_numpy_handler(PyObject *mod, PyObject *unused)
{
    if (!default_resolver || !selected_var || !resource_var) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    HandlerState *state = PyMem_RawCalloc(1, sizeof(HandlerState));
    PyDataMem_Handler *handler = PyMem_RawCalloc(1, sizeof(PyDataMem_Handler));
    if (!state || !handler) {
        PyMem_RawFree(state);
        PyMem_RawFree(handler);
        return PyErr_NoMemory();
    }
    state->generation = generation;
    strncpy(handler->name, HANDLER_NAME, sizeof(handler->name) - 1);
    handler->version = 1;
    handler->allocator.ctx = state;
    handler->allocator.malloc = handler_malloc;
    handler->allocator.calloc = handler_calloc;
    handler->allocator.realloc = handler_realloc;
    handler->allocator.free = handler_free;
    PyObject *capsule = PyCapsule_New(handler, "mem_handler", capsule_never_freed);
    if (!capsule || PyList_Append(capsules, capsule) < 0) {
        Py_XDECREF(capsule);
        return NULL; /* (state and handler leak: a capsule may already reference them) */
    }
    return capsule;
}

static PyObject *
py_set_numpy_handler(PyObject *mod, PyObject *capsule)
{
    return PyDataMem_SetHandler(capsule == Py_None ? NULL : capsule);
}

static PyObject *
py_get_numpy_handler(PyObject *mod, PyObject *unused)
{
    return PyDataMem_GetHandler();
}

static PyObject *
py_configure(PyObject *mod, PyObject *args)
{
    PyObject *resolver, *selected, *resource;
    if (!PyArg_ParseTuple(args, "OOO:configure", &resolver, &selected, &resource))
        return NULL;
    if (!PyCallable_Check(resolver) || !PyContextVar_CheckExact(selected) ||
        !PyContextVar_CheckExact(resource)) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(resolver, selected_resources, numpy_resource): a callable "
                        "and two ContextVars");
        return NULL;
    }
    Py_XSETREF(default_resolver, Py_NewRef(resolver));
    Py_XSETREF(selected_var, Py_NewRef(selected));
    Py_XSETREF(resource_var, Py_NewRef(resource));
    resources_version++;
    Py_RETURN_NONE;
}

static PyObject *
py_configure_free_in_gc(PyObject *mod, PyObject *callable)
{
    if (!PyCallable_Check(callable)) {
        PyErr_SetString(PyExc_TypeError, "configure_free_in_gc(callable)");
        return NULL;
    }
    Py_XSETREF(free_later, Py_NewRef(callable));
    Py_RETURN_NONE;
}

/* gc.callbacks' (phase, info): counts the collections in progress. */
static PyObject *
py_gc_phase(PyObject *mod, PyObject *args)
{
    PyObject *phase, *info;
    if (!PyArg_ParseTuple(args, "UO:numpy_gc_phase", &phase, &info))
        return NULL;
    if (PyUnicode_CompareWithASCIIString(phase, "start") == 0)
        collecting++;
    else if (collecting > 0)
        collecting--;
    Py_RETURN_NONE;
}

static PyObject *
py_resources_changed(PyObject *mod, PyObject *unused)
{
    resources_version++;
    Py_RETURN_NONE;
}

static PyObject *
py_stop_numpy_handlers(PyObject *mod, PyObject *unused)
{
    stopped = 1;
    Py_RETURN_NONE;
}

/* Whether arr's handler is one of this module's (NumPy's data came from svmkit or, for a
 * nested request, from plain malloc; the table tells which). */
static int
is_svmkit_handler(PyObject *capsule)
{
    if (!capsule || !PyCapsule_IsValid(capsule, "mem_handler"))
        return 0;
    PyDataMem_Handler *h = PyCapsule_GetPointer(capsule, "mem_handler");
    return h && h->allocator.malloc == handler_malloc;
}

static Slot *owner_slot(PyArrayObject *arr);

static PyObject *
py_numpy_allocation(PyObject *mod, PyObject *obj)
{
    Slot *slot = PyArray_Check(obj) ? owner_slot((PyArrayObject *)obj) : NULL;
    return Py_NewRef(slot ? (PyObject *)slot->record : Py_None);
}

/* The table's slot of the array that owns arr's data, or NULL (not an svmkit handler's). */
static Slot *
owner_slot(PyArrayObject *arr)
{
    for (int hops = 0; !PyArray_CHKFLAGS(arr, NPY_ARRAY_OWNDATA); hops++) {
        PyObject *base = PyArray_BASE(arr);
        if (!base || !PyArray_Check(base) || hops > 1000)
            return NULL;
        arr = (PyArrayObject *)base;
    }
    if (!is_svmkit_handler(PyArray_HANDLER(arr)))
        return NULL;
    Slot *slot = table_find((uintptr_t)PyArray_DATA(arr));
    return slot && !slot->record->freed ? slot : NULL;
}

/* numpy_argument(ndarray, make_pointer): (allocation, SVM pointer) of an allocator-made array
 * given as a kernel argument, or None.  The pointer of an array that spans its whole
 * allocation from its start (the common case: the array NumPy made) is made once,
 * make_pointer(allocation.u8), and kept with the table's entry; any other array's is
 * make_pointer(ndarray) (PyOpenCL's ValueError for a non-contiguous one propagates). */
static PyObject *
py_numpy_argument(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "numpy_argument(ndarray, make_pointer)");
        return NULL;
    }
    if (!PyArray_Check(args[0]))
        Py_RETURN_NONE;
    PyArrayObject *arr = (PyArrayObject *)args[0];
    Slot *slot = owner_slot(arr);
    if (!slot)
        Py_RETURN_NONE;
    Record *record = slot->record;
    PyObject *pointer = NULL;
    int whole = PyArray_IS_C_CONTIGUOUS(arr) &&
                PyLong_AsVoidPtr(record->ptr) == PyArray_DATA(arr) &&
                PyLong_AsSsize_t(record->nbytes) == PyArray_NBYTES(arr);
    if (whole && slot->pointer) {
        pointer = Py_NewRef(slot->pointer);
    }
    else if (whole) {
        Py_INCREF(record); /* (make_pointer runs Python: the slot may move meanwhile) */
        PyObject *u8 = PyObject_GetAttr((PyObject *)record, str_u8);
        pointer = u8 ? PyObject_CallOneArg(args[1], u8) : NULL;
        Py_XDECREF(u8);
        Slot *again = pointer ? owner_slot(arr) : NULL;
        if (again && again->record == record && !again->pointer)
            again->pointer = Py_NewRef(pointer);
        Py_DECREF(record);
    }
    else {
        pointer = PyObject_CallOneArg(args[1], args[0]);
    }
    if (!pointer)
        return NULL;
    PyObject *out = PyTuple_Pack(2, (PyObject *)record, pointer);
    Py_DECREF(pointer);
    return out;
}

static PyObject *
py_numpy_blocks(PyObject *mod, PyObject *unused)
{
    return PyLong_FromSize_t(nlive);
}

static PyObject *
py_system_alloc(PyObject *mod, PyObject *args)
{
    Py_ssize_t n, alignment;
    if (!PyArg_ParseTuple(args, "nn:system_alloc", &n, &alignment))
        return NULL;
    if (n < 1 || alignment < 1 || (alignment & (alignment - 1))) {
        PyErr_SetString(PyExc_ValueError, "system_alloc(nbytes >= 1, alignment: a power of two)");
        return NULL;
    }
    void *ptr = NULL;
    long page = sysconf(_SC_PAGESIZE);
    if ((size_t)n >= HUGE_PAGE_THRESHOLD && alignment <= page) {
        Py_BEGIN_ALLOW_THREADS
        ptr = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
#ifdef MADV_HUGEPAGE
        if (ptr != MAP_FAILED)
            madvise(ptr, (size_t)n, MADV_HUGEPAGE); /* (advice: failure is harmless) */
#endif
        Py_END_ALLOW_THREADS
        if (ptr == MAP_FAILED)
            return PyErr_NoMemory();
    }
    else {
        size_t align = (size_t)alignment < sizeof(void *) ? sizeof(void *) : (size_t)alignment;
        int err;
        Py_BEGIN_ALLOW_THREADS
        err = posix_memalign(&ptr, align, (size_t)n);
        Py_END_ALLOW_THREADS
        if (err)
            return PyErr_NoMemory();
    }
    return PyLong_FromVoidPtr(ptr);
}

static PyObject *
py_system_free(PyObject *mod, PyObject *args)
{
    PyObject *addr;
    Py_ssize_t n, alignment;
    if (!PyArg_ParseTuple(args, "Onn:system_free", &addr, &n, &alignment))
        return NULL;
    void *ptr = PyLong_AsVoidPtr(addr);
    if (!ptr)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    long page = sysconf(_SC_PAGESIZE);
    if ((size_t)n >= HUGE_PAGE_THRESHOLD && alignment <= page)
        munmap(ptr, (size_t)n);
    else
        free(ptr);
    Py_RETURN_NONE;
}

PyMethodDef numpy_handler_methods[] = {
    {"numpy_handler", py_numpy_handler, METH_NOARGS,
     "numpy_handler(): a new NEP 49 handler capsule (immortal) whose arrays are allocations "
     "of the resource the numpy_resource context variable names, or of the default "
     "context's current resource when it names none."},
    {"set_numpy_handler", py_set_numpy_handler, METH_O,
     "set_numpy_handler(capsule or None): NumPy's PyDataMem_SetHandler in the current "
     "context; returns the handler that was set."},
    {"get_numpy_handler", py_get_numpy_handler, METH_NOARGS,
     "NumPy's PyDataMem_GetHandler(): the current context's handler capsule."},
    {"configure", py_configure, METH_VARARGS,
     "configure(resolver, selected_resources, numpy_resource): the resource a request draws "
     "from is numpy_resource's value, else the one resolver() names (called again whenever "
     "selected_resources' value or the process-wide defaults changed)."},
    {"configure_free_in_gc", py_configure_free_in_gc, METH_O,
     "configure_free_in_gc(callable): a block NumPy frees during a garbage collection is "
     "given to callable(allocation), which frees it without taking a pool's lock."},
    {"numpy_gc_phase", py_gc_phase, METH_VARARGS,
     "numpy_gc_phase(phase, info): for gc.callbacks; counts the collections in progress."},
    {"resources_changed", py_resources_changed, METH_NOARGS,
     "A process-wide default resource changed: the default handler looks it up again."},
    {"stop_numpy_handlers", py_stop_numpy_handlers, METH_NOARGS,
     "At exit: every later request gets plain memory, listed blocks are left."},
    {"numpy_allocation", py_numpy_allocation, METH_O,
     "numpy_allocation(ndarray): the live Allocation behind the array's data (through its "
     "bases), or None when its memory is not an svmkit handler's."},
    {"numpy_argument", (PyCFunction)(void (*)(void))py_numpy_argument, METH_FASTCALL,
     "numpy_argument(ndarray, make_pointer): (allocation, PyOpenCL SVM pointer) of an "
     "allocator-made array as a kernel argument (the whole allocation's pointer made once), "
     "or None."},
    {"numpy_blocks", py_numpy_blocks, METH_NOARGS,
     "How many allocations the handlers' table lists (live NumPy data in svmkit memory)."},
    {"system_alloc", py_system_alloc, METH_VARARGS,
     "system_alloc(nbytes, alignment): host memory for SYSTEM SVM (posix_memalign; mmap "
     "madvised for huge pages from 4 MiB), never from NumPy; its address."},
    {"system_free", py_system_free, METH_VARARGS,
     "system_free(address, nbytes, alignment): give back what system_alloc returned."},
    {NULL}};

/* Called by the module's init: NumPy's C API and this file's state. */
int
numpy_handler_init(void)
{
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    capsules = PyList_New(0);
    str_wait_recorded = PyUnicode_InternFromString("wait_recorded");
    str_allocate_method = PyUnicode_InternFromString("allocate");
    return capsules && str_wait_recorded && str_allocate_method ? 0 : -1;
}

#pragma GCC visibility pop
