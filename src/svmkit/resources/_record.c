/* svmkit.resources._cpool, the allocation record: the storage of svmkit.Allocation (a
 * Python subclass of Record) and the common case of its free(): a pooled block with no
 * export, no open map and no recorded command goes straight back to its pool's ready list
 * (_cpool.c's BlockCache); every other case runs Allocation._free in Python.
 */
#include "_cpool.h"


#define RECORD_FIELDS(X)                                                                       \
    X(resource) X(context) X(policy) X(ptr) X(nbytes) X(block) X(u8) X(events) X(map_state)    \
        X(memo) X(exports) X(cache)

static PyObject *
Record_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Record *self = (Record *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
#define SET_NONE(f) self->f = Py_NewRef(Py_None);
    RECORD_FIELDS(SET_NONE)
#undef SET_NONE
    Py_CLEAR(self->cache);
    self->freed = 0;
    return (PyObject *)self;
}

PyObject *
cache_hand_out(BlockCache *self, PyObject *owner, Block *block, PyObject *nbytes, Py_ssize_t n)
{
    Record *rec = (Record *)((PyTypeObject *)self->record_type)
                      ->tp_alloc((PyTypeObject *)self->record_type, 0);
    if (!rec) {
        /* The allocation never happened: the block is given back (to the ready list, or,
         * unpooled or beyond max_cached_bytes, upstream through the pool). */
        PyObject *exc = fetch_exception();
        cache_lock(self);
        int kept = cache_give_locked(self, block, n, NULL);
        cache_unlock(self);
        if (!kept) {
            PyObject *r = PyObject_CallMethodOneArg(owner, str_release, (PyObject *)block);
            if (!r)
                PyErr_WriteUnraisable(owner);
            Py_XDECREF(r);
        }
        Py_DECREF(block); /* outside the lock: a last reference runs finalisers */
        restore_exception(exc);
        return NULL;
    }
    rec->resource = Py_NewRef(owner);
    rec->context = Py_NewRef(self->context);
    rec->policy = Py_NewRef(self->policy);
    rec->ptr = Py_NewRef(block->ptr);
    rec->nbytes = Py_NewRef(nbytes);
    rec->block = (PyObject *)block; /* the reference moves */
    rec->u8 = NULL; /* made on first use (the `u8` getter) */
    rec->events = Py_NewRef(Py_None);
    rec->map_state = Py_NewRef(Py_None);
    rec->memo = Py_NewRef(block->memo);
    rec->exports = Py_NewRef(Py_None);
    rec->cache = Py_NewRef((PyObject *)self);
    rec->freed = 0;
    return (PyObject *)rec;
}

/* free(): the common case here, every other case in Allocation._free (Python). */
PyObject *
Record_free(Record *self, PyObject *unused)
{
    if (self->freed)
        Py_RETURN_NONE;
    BlockCache *cache = (BlockCache *)self->cache;
    PyObject *owner = cache ? cache_owner(cache) : NULL;
    Py_XDECREF(owner); /* (compared only: the record's own reference keeps its resource) */
    if (cache && owner && cache->counts && cache->generation == generation &&
        self->exports == Py_None && self->map_state == Py_None && self->events == Py_None &&
        self->resource == owner && self->block &&
        Py_IS_TYPE(self->block, &BlockType) && self->nbytes && PyLong_CheckExact(self->nbytes)) {
        Py_ssize_t n = PyLong_AsSsize_t(self->nbytes);
        if (n > 0) {
            /* Nothing exported (so no export may release it later), no open map, no
             * recorded command: the block is ready for reuse at once. */
            self->freed = 1;
            Block *block = (Block *)self->block;
            cache_lock(cache);
            int kept = cache_give_locked(cache, block, n, NULL);
            cache_unlock(cache);
            if (kept)
                Py_RETURN_NONE;
            return PyObject_CallMethodOneArg(self->resource, str_release, (PyObject *)block);
        }
        PyErr_Clear();
    }
    return PyObject_CallMethodNoArgs((PyObject *)self, str_free);
}

static void
Record_finalize(PyObject *obj)
{
    if (((Record *)obj)->freed || Py_IS_TYPE(obj, &RecordType))
        return; /* (a bare Record has no resource to give memory back to) */
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
#endif
    PyObject *result = PyObject_CallMethodNoArgs(obj, str_finalize);
    if (!result)
        PyErr_WriteUnraisable(obj);
    Py_XDECREF(result);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(type, value, tb);
#endif
}

static int
Record_traverse(Record *self, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(self->f);
    RECORD_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int
Record_clear(Record *self)
{
#define CLEAR(f) Py_CLEAR(self->f);
    RECORD_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void
Record_dealloc(Record *self)
{
    /* (a Python subclass's instances are finalised by CPython's subtype_dealloc first) */
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    Record_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Record_methods[] = {
    {"free", (PyCFunction)Record_free, METH_NOARGS,
     "Give the memory back to its resource after recorded commands finish; idempotent.\n\n"
     "The allocation is freed at once (svmkit refuses every later use); its memory goes\n"
     "back only once the last export of it is gone (svmkit.resources.exports)."},
    {NULL}};

static PyMemberDef Record_members[] = {
    {"resource", T_OBJECT, offsetof(Record, resource), 0,
     "the outermost resource that handed it out and takes it back"},
    {"context", T_OBJECT, offsetof(Record, context), 0, NULL},
    {"policy", T_OBJECT, offsetof(Record, policy), 0, NULL},
    {"ptr", T_OBJECT, offsetof(Record, ptr), 0, "address of the first byte"},
    {"nbytes", T_OBJECT, offsetof(Record, nbytes), 0, "bytes asked for"},
    {"block", T_OBJECT, offsetof(Record, block), 0, "the resource's own bookkeeping"},
    {"_events", T_OBJECT, offsetof(Record, events), 0, "EventRecord, or None"},
    {"map_state", T_OBJECT, offsetof(Record, map_state), 0, "MapState, or None"},
    {"memo", T_OBJECT, offsetof(Record, memo), 0, "per-block cache, or None"},
    {"exports", T_OBJECT, offsetof(Record, exports), 0, "ExportRecord, or None"},
    {"freed", T_BOOL, offsetof(Record, freed), 0, "whether free() ran"},
    {NULL}};

/* A pooled record's byte view is made on first use: most hand-outs never need it. */
static PyObject *
Record_get_u8(Record *self, void *closure)
{
    if (!self->u8) {
        if (!self->block || !PyObject_TypeCheck(self->block, &BlockType) || !self->nbytes) {
            PyErr_SetString(PyExc_AttributeError, "u8");
            return NULL;
        }
        Py_ssize_t n = PyLong_AsSsize_t(self->nbytes);
        if (n == -1 && PyErr_Occurred())
            return NULL;
        self->u8 = block_bytes_for((Block *)self->block, n);
        if (!self->u8)
            return NULL;
    }
    return Py_NewRef(self->u8);
}

static int
Record_set_u8(Record *self, PyObject *value, void *closure)
{
    Py_XINCREF(value);
    Py_XSETREF(self->u8, value);
    return 0;
}

static PyGetSetDef Record_getset[] = {
    {"u8", (getter)Record_get_u8, (setter)Record_set_u8, "uint8 NumPy view of the bytes", NULL},
    {NULL}};

PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "svmkit.resources._cpool.Record",
    .tp_basicsize = sizeof(Record),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The storage of svmkit.Allocation (subclassed there) and free()'s common case.",
    .tp_new = Record_new,
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_traverse = (traverseproc)Record_traverse,
    .tp_clear = (inquiry)Record_clear,
    .tp_finalize = Record_finalize,
    .tp_weaklistoffset = offsetof(Record, weakreflist),
    .tp_methods = Record_methods,
    .tp_members = Record_members,
    .tp_getset = Record_getset,
};

