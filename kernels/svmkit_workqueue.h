/* svmkit_workqueue.h - the device side of sk.WorkQueue: a bounded MPMC ring in fine-grain SVM.
 *
 * The host (svmkit/workqueue/) and every device of the context push and pop on the same
 * ring at the same time, with SVM atomics (clSVMAlloc with CL_MEM_SVM_FINE_GRAIN_BUFFER |
 * CL_MEM_SVM_ATOMICS).  Usage:
 *
 *     #include "svmkit_workqueue.h"          // WQ_ITEM defaults to long; for a record
 *                                            // (a struct of up to 64 bytes) put
 *                                            // sk.WorkQueue.source_for(dtype) first
 *     __kernel void consume(__global svmkit_wq *q, __global long *out) {
 *         WQ_ITEM item;
 *         while (wq_pop(q, &item)) { ... }   // ends once the host closed the queue and
 *     }                                      // every item was popped
 *
 * API (exactly as svmkit's API.md gives it):
 *   bool wq_push(q, item)       blocks while full; false if the queue is closed
 *   bool wq_pop(q, &item)       blocks while empty; false once closed and drained
 *   bool wq_try_push(q, item)   false if full or closed (nothing waits)
 *   bool wq_try_pop(q, &item)   false if nothing is there now
 * and beyond it: void wq_close(q) (as WorkQueue.close(), e.g. when the last task ends),
 * bool wq_drained(q) (closed and every item popped), and batch operations that claim a run
 * with one compare-exchange (one atomic per batch instead of per item):
 *   int wq_try_pop_many(q, items, max)  up to `max` published items, 0 if nothing now
 *   int wq_pop_many(q, items, max)      blocks while empty; 0 once closed and drained
 *   int wq_push_many(q, items, n)       blocks while full; n, or fewer if closed
 *   bool wq_pop_ahead(q, &cursor, ahead, &item)  per item, claiming up to `ahead` at once
 * on a private array, and the same on __local memory (PoCL 3.0 has no generic address
 * space): wq_try_pop_batch, wq_pop_batch, wq_push_batch.  Work-group consumers call
 *   int wq_group_pop(q, __local items, max, __local int *scratch)
 *   int wq_group_push(q, __local items, n, __local int *scratch)
 * from every work-item: one work-item claims the run (one compare-exchange), the group
 * copies it into local memory and works on it, and the count the claimer broadcasts (0:
 * closed and drained) makes the group leave together.
 *
 * Running tasks (the recommended pattern).  A task queue's consumer is a persistent kernel
 * of work-groups that each claim 16 to 64 tasks at once with wq_group_pop into __local
 * memory, then run them one after another with the whole group (or one per work-item):
 * one compare-exchange and five barriers per claim instead of per task.  A claim has a
 * cost of its own that one task cannot carry (a claim of 64 light tasks of 64 work-items:
 * 1.2 µs on Intel's CPU runtime, more than the 64 tasks' own 0.7 µs; half of it is the
 * slots' acquire loads and release stores, which its vectorized code makes one lane at a
 * time), which is what makes a queue of one-task claims lose to a launch per batch; 16-64
 * amortises it over the tasks.  A larger claim leaves fewer tasks for the other groups at
 * the end (the last claim's tasks run on one group): 64 suits
 * tasks of up to a few µs, 16 heavier ones.  The records a task needs (an id, an opcode)
 * travel as a struct: sk.WorkQueue(ctx, capacity, dtype) with a structured dtype, and
 * sk.WorkQueue.source_for(dtype) before this header.
 *
 *     __kernel void run_tasks(__global svmkit_wq *tasks, __global int *data)
 *     {
 *         __local WQ_ITEM claim[64];
 *         __local int scratch;
 *         int k;
 *         while ((k = wq_group_pop(tasks, claim, 64, &scratch)) > 0)
 *             for (int t = 0; t < k; t++)
 *                 run_task(claim[t], data);   // all work-items of the group, barriers ok
 *     }
 *
 * A single work-item consumer (local size 1) uses wq_pop (one compare-exchange per item) or,
 * faster, wq_pop_many into a private array (one per run of items).
 *
 * Forward progress: OpenCL promises none between work-items of one work-group, so a
 * work-item that may block (wq_pop, wq_push, the *_many and *_batch calls) must be alone in
 * its work-group or the only one of its group that blocks (wq_group_pop/wq_group_push wait
 * as a whole group, through barriers), and the persistent grid must not exceed the
 * work-groups that run at once (sk.persistent_grid picks it).  A kernel whose work-items
 * both pop and push uses wq_try_push and does the work inline when the ring is full.
 *
 * Layout (byte offsets; svmkit/workqueue/layout.py holds the same constants, and a test
 * compares this header's macros and struct with it):
 *     0  head    ulong  consumers' claim counter            (own 64-byte line)
 *    64  tail    ulong  producers' claim counter; bit 63 = closed  (own line)
 *   128  closed  uint   mirror of tail's bit 63, read while idle    (own line)
 *   192  mask (ulong), capacity (ulong), item_size (uint), magic (uint), slot_bytes (uint):
 *        set once by the host
 *   256  slots[capacity], slot_bytes each (8 + the item size rounded up to 8: 16 for items
 *        of up to 8 bytes): ulong seq at +0, WQ_ITEM item at +8
 *
 * Protocol (D. Vyukov's bounded MPMC queue).  Slot i starts with seq == i.  A producer at
 * position p (slot p & mask) may write once seq == p: it claims p by a compare-exchange of
 * tail from p to p + 1, writes the item, then stores seq = p + 1 with RELEASE.  A consumer
 * at position p waits for seq == p + 1 (ACQUIRE load, so the item is visible), claims p by a
 * compare-exchange of head, reads the item, then stores seq = p + capacity with RELEASE
 * (the slot is free for the producer of the next lap).  The compare-exchanges are relaxed:
 * only the slot's seq carries the item between agents.  Positions are 63-bit counters,
 * compared through a signed difference, so they never wrap in practice.
 *
 * Closing sets bit 63 of tail with one atomic fetch-or.  Because a producer claims a slot
 * with a compare-exchange on that same word, every claim is ordered either before the close
 * (its item will be drained) or after it (it fails and reports "closed"): the flag cannot
 * race with a claim in flight, which a flag on its own word could.  A consumer that finds
 * its slot empty reads the `closed` mirror (a line that stays shared while idle) and, when
 * set, reads tail with ACQUIRE: the queue is drained once head reached tail's position.
 *
 * Scope: SVMKIT_SCOPE (svmkit.build_program: memory_scope_all_svm_devices where every device
 * has it, else memory_scope_device, see svmkit_atomics.h).
 */
#ifndef SVMKIT_WORKQUEUE_H
#define SVMKIT_WORKQUEUE_H

#include "svmkit_atomics.h"

#if defined(cl_khr_int64_base_atomics)
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
#endif
#if defined(cl_khr_int64_extended_atomics)
#pragma OPENCL EXTENSION cl_khr_int64_extended_atomics : enable
#endif

#ifndef WQ_ITEM
#define WQ_ITEM long
#endif

/* The layout (svmkit/workqueue/layout.py holds the same values; a test compares them). */
#define SVMKIT_WQ_HEAD_OFFSET 0
#define SVMKIT_WQ_TAIL_OFFSET 64
#define SVMKIT_WQ_CLOSED_OFFSET 128
#define SVMKIT_WQ_PARAMS_OFFSET 192
#define SVMKIT_WQ_ITEM_SIZE_OFFSET 208
#define SVMKIT_WQ_MAGIC_OFFSET 212
#define SVMKIT_WQ_SLOT_BYTES_OFFSET 216
#define SVMKIT_WQ_HEADER_BYTES 256
#define SVMKIT_WQ_ITEM_OFFSET 8
#define SVMKIT_WQ_MAX_ITEM_BYTES 64
#define SVMKIT_WQ_MAGIC 0x53564d51u /* "SVMQ" */
#define SVMKIT_WQ_CLOSED ((ulong)1 << 63)

typedef struct {
    atomic_ulong head;
    uchar _pad0[56];
    atomic_ulong tail;
    uchar _pad1[56];
    atomic_uint closed;
    uchar _pad2[60];
    ulong mask;
    ulong capacity;
    uint item_size;
    uint magic;
    uint slot_bytes;
    uchar _pad3[36];
} svmkit_wq;

/* WQ_ITEM must fit a slot's item, and the struct must be the header. */
typedef char svmkit_wq_item_fits_in_a_slot[(sizeof(WQ_ITEM) <= SVMKIT_WQ_MAX_ITEM_BYTES) ? 1
                                                                                       : -1];
typedef char svmkit_wq_header_size[(sizeof(svmkit_wq) == SVMKIT_WQ_HEADER_BYTES) ? 1 : -1];
#if defined(__clang__)
typedef char svmkit_wq_offsets[(__builtin_offsetof(svmkit_wq, tail) == SVMKIT_WQ_TAIL_OFFSET &&
                                __builtin_offsetof(svmkit_wq, closed) == SVMKIT_WQ_CLOSED_OFFSET &&
                                __builtin_offsetof(svmkit_wq, mask) == SVMKIT_WQ_PARAMS_OFFSET &&
                                __builtin_offsetof(svmkit_wq, item_size) ==
                                    SVMKIT_WQ_ITEM_SIZE_OFFSET &&
                                __builtin_offsetof(svmkit_wq, slot_bytes) ==
                                    SVMKIT_WQ_SLOT_BYTES_OFFSET)
                                   ? 1
                                   : -1];
#endif

/* Slot `pos & mask` is slot_bytes long (the header's stride, written by the host: the same
 * the host's rings read, whatever item type a kernel was built for). */
inline __global atomic_ulong *svmkit_wq_seq(__global svmkit_wq *q, ulong pos)
{
    return (__global atomic_ulong *)((__global uchar *)q + SVMKIT_WQ_HEADER_BYTES +
                                     (pos & q->mask) * q->slot_bytes);
}

inline __global WQ_ITEM *svmkit_wq_item(__global svmkit_wq *q, ulong pos)
{
    return (__global WQ_ITEM *)((__global uchar *)q + SVMKIT_WQ_HEADER_BYTES +
                                (pos & q->mask) * q->slot_bytes + SVMKIT_WQ_ITEM_OFFSET);
}

/* 1: pushed, 0: full, -1: closed. */
inline int wq_try_push_status(__global svmkit_wq *q, WQ_ITEM item)
{
    ulong pos = svmkit_load_relaxed(&q->tail);
    for (;;) {
        if (pos & SVMKIT_WQ_CLOSED)
            return -1;
        __global atomic_ulong *seq = svmkit_wq_seq(q, pos);
        long dif = (long)(svmkit_load_acquire(seq) - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + 1,
                                                      memory_order_relaxed,
                                                      memory_order_relaxed, SVMKIT_SCOPE)) {
                *svmkit_wq_item(q, pos) = item;
                svmkit_store_release(seq, pos + 1);
                return 1;
            }
            /* pos now holds the tail another producer left */
        } else if (dif < 0) {
            return 0; /* the slot still holds last lap's item: full */
        } else {
            pos = svmkit_load_relaxed(&q->tail);
        }
    }
}

inline bool wq_try_push(__global svmkit_wq *q, WQ_ITEM item)
{
    return wq_try_push_status(q, item) > 0;
}

inline bool wq_push(__global svmkit_wq *q, WQ_ITEM item)
{
    for (;;) {
        int status = wq_try_push_status(q, item);
        if (status != 0)
            return status > 0;
    }
}

inline bool wq_try_pop(__global svmkit_wq *q, WQ_ITEM *item)
{
    ulong pos = svmkit_load_relaxed(&q->head);
    for (;;) {
        __global atomic_ulong *seq = svmkit_wq_seq(q, pos);
        long dif = (long)(svmkit_load_acquire(seq) - (pos + 1));
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&q->head, &pos, pos + 1,
                                                      memory_order_relaxed,
                                                      memory_order_relaxed, SVMKIT_SCOPE)) {
                *item = *svmkit_wq_item(q, pos);
                svmkit_store_release(seq, pos + q->mask + 1);
                return true;
            }
        } else if (dif < 0) {
            return false; /* not published yet: empty */
        } else {
            pos = svmkit_load_relaxed(&q->head);
        }
    }
}

/* Closed (tail's bit 63) and every claimed position consumed. */
inline bool wq_drained(__global svmkit_wq *q)
{
    if (!svmkit_load_acquire(&q->closed))
        return false;
    ulong tail = svmkit_load_acquire(&q->tail);
    if (!(tail & SVMKIT_WQ_CLOSED))
        return false;
    return (long)(svmkit_load_relaxed(&q->head) - (tail & ~SVMKIT_WQ_CLOSED)) >= 0;
}

/* Take the item at a position this work-item claimed (head moved past it): wait until it is
 * published, read it, free the slot for the next lap.  False when the queue closed before
 * any producer claimed the position (the consumer claimed ahead of the last item). */
inline bool svmkit_wq_take_claimed(__global svmkit_wq *q, ulong pos, WQ_ITEM *item)
{
    __global atomic_ulong *seq = svmkit_wq_seq(q, pos);
    for (;;) {
        if (svmkit_load_acquire(seq) == pos + 1) {
            *item = *svmkit_wq_item(q, pos);
            svmkit_store_release(seq, pos + q->mask + 1);
            return true;
        }
        if (svmkit_load_acquire(&q->closed)) {
            ulong tail = svmkit_load_acquire(&q->tail);
            if ((tail & SVMKIT_WQ_CLOSED) && (long)(pos - (tail & ~SVMKIT_WQ_CLOSED)) >= 0)
                return false; /* closed, and no producer ever claimed pos */
        }
    }
}

/* Per-item pop.  While the item at head is published, one compare-exchange claims it; a
 * consumer that loses that race claims ahead instead, with one fetch-add of head: a
 * position of its own, however many pop at once (a retried compare-exchange fails for all
 * but one of them each round), then a wait on that slot alone.  So a claim costs at most
 * two atomics, and alone, one compare-exchange (a fetch-add on every claim halved one
 * work-item's drain on Intel's CPU runtime: 41 against 82 M items/s).  While the item at
 * head is not published yet (the consumer caught up with the producers) it claims nothing:
 * it watches that slot and the closed flag, so it never waits on a position nobody may
 * ever fill, nor claims the line the producer writes next from under it (a claim-ahead
 * that also did so when empty ran at 2.2 M items/s against 42-52 M, Intel's CPU runtime,
 * batches of 4096).  A loser claims ahead even when it lost the last item (it then waits
 * on a position no producer claimed yet): checking first whether producers claimed beyond
 * head (a load of tail's line) or whether the next slot is published cost more than those
 * claims save (15 consumers on PoCL 5.0, 16-core Xeon, batches of 4096: 6.0 and 5.9
 * against 8.2 M items/s).  Pushes and WorkQueue.reopen() allow head past tail (positions
 * such a consumer claimed when the queue closed). */
inline bool wq_pop(__global svmkit_wq *q, WQ_ITEM *item)
{
    for (;;) {
        ulong head = svmkit_load_relaxed(&q->head);
        __global atomic_ulong *seq = svmkit_wq_seq(q, head);
        if (svmkit_load_acquire(seq) == head + 1) {
            if (atomic_compare_exchange_strong_explicit(&q->head, &head, head + 1,
                                                        memory_order_relaxed,
                                                        memory_order_relaxed, SVMKIT_SCOPE)) {
                *item = *svmkit_wq_item(q, head);
                svmkit_store_release(seq, head + q->mask + 1);
                return true;
            }
            ulong pos = atomic_fetch_add_explicit(&q->head, (ulong)1, memory_order_relaxed,
                                                  SVMKIT_SCOPE);
            return svmkit_wq_take_claimed(q, pos, item);
        }
        if (wq_drained(q))
            return false;
    }
}

/* Claim the run of published items at head, at most `max`, with one compare-exchange:
 * returns its length (0 if nothing is published now) and its first position in *first.
 * head == pos at the exchange means nobody claimed [pos, pos + k) meanwhile, and a published
 * slot stays published until its claimer frees it. */
inline int svmkit_wq_claim_run(__global svmkit_wq *q, int max, ulong *first)
{
    ulong pos = svmkit_load_relaxed(&q->head);
    for (;;) {
        int k = 0;
        while (k < max && svmkit_load_acquire(svmkit_wq_seq(q, pos + k)) == pos + k + 1)
            k++;
        if (k == 0) {
            long dif = (long)(svmkit_load_acquire(svmkit_wq_seq(q, pos)) - (pos + 1));
            if (dif > 0) { /* head moved on */
                pos = svmkit_load_relaxed(&q->head);
                continue;
            }
            return 0;
        }
        if (atomic_compare_exchange_weak_explicit(&q->head, &pos, pos + k,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed, SVMKIT_SCOPE)) {
            *first = pos;
            return k;
        }
    }
}

/* Claim up to `max` free positions at tail with one compare-exchange (all of them were
 * claimed by last lap's consumers already): the count, 0 if full, -1 if closed. */
inline int svmkit_wq_claim_free(__global svmkit_wq *q, int max, ulong *first)
{
    ulong cap = q->mask + 1;
    ulong pos = svmkit_load_relaxed(&q->tail);
    for (;;) {
        if (pos & SVMKIT_WQ_CLOSED)
            return -1;
        long used = (long)(pos - svmkit_load_acquire(&q->head));
        if (used < 0) /* consumers claimed ahead (wq_pop): every slot from tail on is free */
            used = 0;
        if ((ulong)used >= cap)
            return 0;
        ulong k = cap - (ulong)used;
        if ((ulong)max < k)
            k = (ulong)max;
        if (atomic_compare_exchange_weak_explicit(&q->tail, &pos, pos + k,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed, SVMKIT_SCOPE)) {
            *first = pos;
            return (int)k;
        }
    }
}

/* Before a blocking batch claim: when producers reserved more positions at head than are
 * published yet (a host push_many fills its run slot by slot), wait, a bounded number of
 * looks, until the last of them (at most `max` on) is published, so the claim takes the
 * whole run instead of trailing the producer's write front slot by slot (each look at that
 * front takes the line the producer writes next).  Never waits for an item nobody claimed
 * to write: only positions below tail, whose producers are filling them. */
#ifndef SVMKIT_GATHER_LOOKS
#define SVMKIT_GATHER_LOOKS 4096
#endif
inline void svmkit_wq_gather(__global svmkit_wq *q, int max)
{
    ulong head = svmkit_load_relaxed(&q->head);
    long reserved = (long)((svmkit_load_acquire(&q->tail) & ~SVMKIT_WQ_CLOSED) - head);
    if (reserved <= 1 || max <= 1)
        return;
    ulong last = head + (ulong)(reserved < max ? reserved : max) - 1;
    __global atomic_ulong *seq = svmkit_wq_seq(q, last);
    for (int i = 0; i < SVMKIT_GATHER_LOOKS; i++) {
        if (svmkit_load_acquire(seq) == last + 1 || svmkit_load_relaxed(&q->head) != head)
            return; /* the run is published, or another consumer claimed from it */
    }
}

/* Batch operations for one address space of the caller's items (`AS` empty: the default,
 * private or generic).  PoCL 3.0 has no generic address space, so __local buffers get their
 * own functions (wq_*_batch) instead of a generic pointer.
 *   try_pop:  claim a published run, copy it out, free each slot (seq = pos + capacity).
 *   pop:      the same, waiting while empty; 0 once closed and drained.
 *   push:     claim free positions, wait for last lap's consumer to free each slot (it
 *             claimed it already, so this never waits on a blocked agent, unless that
 *             consumer holds it in a wq_pop_ahead cursor), write, publish;
 *             repeats until all `n` went in (blocking while full): returns n, or how many
 *             went in before the queue was closed. */
#define SVMKIT_WQ_BATCH_OPS(TRY_POP, POP, PUSH, AS)                                         \
    inline int TRY_POP(__global svmkit_wq *q, AS WQ_ITEM *items, int max)                   \
    {                                                                                       \
        ulong first;                                                                        \
        int k = svmkit_wq_claim_run(q, max, &first);                                        \
        for (int i = 0; i < k; i++) {                                                       \
            items[i] = *svmkit_wq_item(q, first + i);                                       \
            svmkit_store_release(svmkit_wq_seq(q, first + i), first + i + q->mask + 1);     \
        }                                                                                   \
        return k;                                                                           \
    }                                                                                       \
    inline int POP(__global svmkit_wq *q, AS WQ_ITEM *items, int max)                       \
    {                                                                                       \
        for (;;) {                                                                          \
            svmkit_wq_gather(q, max);                                                       \
            int k = TRY_POP(q, items, max);                                                 \
            if (k)                                                                          \
                return k;                                                                   \
            if (wq_drained(q))                                                              \
                return 0;                                                                   \
        }                                                                                   \
    }                                                                                       \
    inline int PUSH(__global svmkit_wq *q, const AS WQ_ITEM *items, int n)                  \
    {                                                                                       \
        int done = 0;                                                                       \
        while (done < n) {                                                                  \
            ulong first;                                                                    \
            int k = svmkit_wq_claim_free(q, n - done, &first);                              \
            if (k < 0)                                                                      \
                break;                                                                      \
            for (int i = 0; i < k; i++) {                                                   \
                __global atomic_ulong *seq = svmkit_wq_seq(q, first + i);                   \
                while (svmkit_load_acquire(seq) != first + i)                               \
                    ;                                                                       \
                *svmkit_wq_item(q, first + i) = items[done + i];                            \
                svmkit_store_release(seq, first + i + 1);                                   \
            }                                                                               \
            done += k;                                                                      \
        }                                                                                   \
        return done;                                                                        \
    }

/* int wq_try_pop_many(q, items, max), wq_pop_many, wq_push_many(q, items, n): items in the
 * default address space (a private array). */
SVMKIT_WQ_BATCH_OPS(wq_try_pop_many, wq_pop_many, wq_push_many, )
/* The same with __local items: wq_try_pop_batch, wq_pop_batch, wq_push_batch. */
SVMKIT_WQ_BATCH_OPS(wq_try_pop_batch, wq_pop_batch, wq_push_batch, __local)

/* ---- Claim-ahead per-item pop ----------------------------------------------------------
 * A consumer that takes one item at a time but claims them a run at a time: its cursor (a
 * private svmkit_wq_cursor, WQ_CURSOR_INIT at first) holds positions it claimed with
 * one compare-exchange (svmkit_wq_claim_run, up to `ahead` published items), and each call
 * hands out the next of them: read the item, free its slot.  So a claim costs one atomic
 * per run and the head line is touched once per run, not per item, where wq_pop's claims
 * serialise every consumer on head (15 consumers on a 16-core Xeon: 8 M items/s with
 * wq_pop, a run-claiming consumer 100-120 M).  It claims only published items (never
 * ahead of the producers), so it never waits on a position nobody fills.
 *
 *     svmkit_wq_cursor c = WQ_CURSOR_INIT;
 *     WQ_ITEM x;
 *     while (wq_pop_ahead(q, &c, 64, &x)) { ... }
 *
 * Items a cursor holds are this work-item's: pop until the call returns false (closed and
 * drained; the cursor is then empty).  A kernel that stops earlier leaves the items its
 * cursor holds (at most `ahead`) unconsumed and their slots taken, and producers block on
 * those slots a lap later.  For the same reason a work-item that holds items of q in its
 * cursor pushes to q only with wq_try_push: a blocking push (wq_push, wq_group_push, the
 * batch pushes) may wait a lap later for a slot its own cursor holds.  A larger `ahead` costs latency under a slow producer (one
 * consumer takes what others could have run): 16-64 suits a stream, 1 is wq_pop's order. */
typedef struct {
    ulong next, end; /* claimed positions [next, end) not handed out yet */
} svmkit_wq_cursor;
#define WQ_CURSOR_INIT {0, 0}

inline bool wq_pop_ahead(__global svmkit_wq *q, svmkit_wq_cursor *cursor, int ahead,
                         WQ_ITEM *item)
{
    for (;;) {
        if (cursor->next != cursor->end) {
            ulong pos = cursor->next++;
            *item = *svmkit_wq_item(q, pos);
            svmkit_store_release(svmkit_wq_seq(q, pos), pos + q->mask + 1);
            return true;
        }
        svmkit_wq_gather(q, ahead);
        ulong first;
        int k = svmkit_wq_claim_run(q, ahead < 1 ? 1 : ahead, &first);
        if (k) {
            cursor->next = first;
            cursor->end = first + (ulong)k;
        } else if (wq_drained(q)) {
            return false;
        }
    }
}

/* ---- Work-group consumers -----------------------------------------------------------------
 * Every work-item of the group calls these with the same arguments (uniform control flow:
 * they contain barriers).  One work-item (local linear id 0, the leader) makes the claim
 * (one compare-exchange) and broadcasts the count through *scratch, so the group leaves
 * together once the queue is closed and drained (count 0).  The group works the run
 * together, with no work-item looping alone: each work-item looks at its own slots of the
 * run (published? free?) and copies its items in or out, the leader exchanges head or tail
 * once, and the group waits by going round that loop together, barriers included.  A loop
 * that one work-item runs alone with atomics in it is what a CPU compiler cannot vectorize:
 * Intel's CPU runtime compiled a whole task kernel, its tasks included, without vectorizing
 * it (a 32,000-task run took 4.0 ms with the leader's claim loop, 1.4 ms with the group's).
 *
 *     __local WQ_ITEM in[64], out[64];
 *     __local int scratch;
 *     int k;
 *     while ((k = wq_group_pop(work, in, 64, &scratch)) > 0) {
 *         for (int i = get_local_id(0); i < k; i += get_local_size(0))
 *             out[i] = f(in[i]);
 *         if (wq_group_push(results, out, k, &scratch) < k)
 *             break;                      // the results queue was closed
 *     }
 *
 * Any 1-, 2- or 3-D local size works (work-items are numbered by their linear id).  On
 * PoCL (3.0 and 5.0 seen) give the group's size to the first dimension: with a local size
 * of (1, n), PoCL ran work-item (0, 0)'s code after a claim twice in a loop of claims.
 */
inline size_t svmkit_wq_local_linear_id(void)
{
    return (get_local_id(2) * get_local_size(1) + get_local_id(1)) * get_local_size(0) +
           get_local_id(0);
}

/* Bounded rounds a group claim waits for a run producers reserved but did not publish yet
 * (svmkit_wq_gather's reason: claim the run instead of trailing the host's write front). */
#ifndef SVMKIT_GROUP_GATHER_ROUNDS
#define SVMKIT_GROUP_GATHER_ROUNDS 64
#endif

/* One value of the leader's (lid 0) for the whole group, through *scratch: every work-item
 * returns it.  Starts with a barrier, so *scratch may still be read by a previous step. */
inline int svmkit_wq_group_broadcast(__local int *scratch, int lid, int value)
{
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0)
        *scratch = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    return *scratch;
}

/* Pop up to `max` items into `items` for the whole group: blocks while empty, 0 once the
 * queue is closed and drained (or at once for max <= 0).  Starts with a barrier, so the
 * group may reuse `items` right after the previous call's work, and ends with one, so every
 * work-item sees every item (and the group may reuse *scratch).  items[k, max) hold nothing
 * after the call, and items[0, max) nothing after a 0: the call uses them on the way.  The claim is svmkit_wq_claim_run's, made by the group in five barriers: the leader
 * reads head (into the first 8 bytes of `items`; through *scratch in two halves, four
 * barriers more, when `items` is smaller), work-item i looks at position head + i (and
 * + i + size, ... for a claim larger than the group) and the first unpublished one bounds
 * the run (atomic_min on *scratch), the leader exchanges head for the run's end, and each
 * work-item copies its items out and frees their slots, as TRY_POP does. */
inline int wq_group_pop(__global svmkit_wq *q, __local WQ_ITEM *items, int max,
                        __local int *scratch)
{
    const int lid = (int)svmkit_wq_local_linear_id();
    const int size = (int)(get_local_size(0) * get_local_size(1) * get_local_size(2));
    const bool head_in_items = (ulong)max * sizeof(WQ_ITEM) >= sizeof(ulong);
    __local uchar *head_bytes = (__local uchar *)items;
    int gathered = 0; /* rounds spent waiting for a reserved run to be published */
    if (max <= 0) { /* claims nothing (and never moves head) */
        barrier(CLK_LOCAL_MEM_FENCE);
        return 0;
    }
    for (;;) {
        ulong pos = 0;
        if (!head_in_items) {
            ulong head = lid == 0 ? svmkit_load_relaxed(&q->head) : 0;
            uint low = as_uint(svmkit_wq_group_broadcast(scratch, lid, as_int((uint)head)));
            uint high = as_uint(
                svmkit_wq_group_broadcast(scratch, lid, as_int((uint)(head >> 32))));
            pos = (ulong)high << 32 | low;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* the caller's work on items, any read of *scratch */
        if (lid == 0) {
            if (head_in_items) {
                ulong head = svmkit_load_relaxed(&q->head);
                for (int b = 0; b < 8; b++)
                    head_bytes[b] = (uchar)(head >> (8 * b));
            }
            *scratch = max;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (head_in_items)
            for (int b = 0; b < 8; b++)
                pos |= (ulong)head_bytes[b] << (8 * b);
        for (int base = 0; base < max; base += size) {
            int i = base + lid;
            if (i < max && svmkit_load_acquire(svmkit_wq_seq(q, pos + i)) != pos + i + 1)
                atomic_min(scratch, i); /* not published (yet, or any more: head moved on) */
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* The leader's answer (no work-item reads *scratch in between): k claimed, 0 closed
         * and drained, -1 look again, -2 look again for the rest of a run producers
         * reserved (at most SVMKIT_GROUP_GATHER_ROUNDS times). */
        if (lid == 0) {
            int k = *scratch, claimed = -1;
            if (k == 0) {
                claimed = wq_drained(q) ? 0 : -1;
            } else {
                ulong tail = svmkit_load_acquire(&q->tail) & ~SVMKIT_WQ_CLOSED;
                if (k < max && (long)(tail - pos) > k && gathered < SVMKIT_GROUP_GATHER_ROUNDS)
                    claimed = -2;
                else if (atomic_compare_exchange_strong_explicit(&q->head, &pos, pos + k,
                                                                 memory_order_relaxed,
                                                                 memory_order_relaxed,
                                                                 SVMKIT_SCOPE))
                    claimed = k;
            }
            *scratch = claimed;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        int k = *scratch;
        if (k == 0) {
            barrier(CLK_LOCAL_MEM_FENCE); /* every work-item has read *scratch */
            return 0;
        }
        if (k == -2)
            gathered++;
        if (k > 0) {
            ulong next_lap = q->mask + 1;
            for (int base = 0; base < k; base += size) {
                int i = base + lid;
                if (i < k) {
                    items[i] = *svmkit_wq_item(q, pos + i);
                    svmkit_store_release(svmkit_wq_seq(q, pos + i), pos + i + next_lap);
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            return k;
        }
    }
}

/* Push items[0, n) for the whole group: n, or fewer if the queue was closed.  Starts with
 * a barrier (every work-item's writes to `items` are visible to the others) and ends with
 * one (the group may reuse `items` at once).  The push is PUSH's, made by the group: the
 * leader claims free positions at tail with one compare-exchange (a run at most n long) and
 * broadcasts the count and the first position, the group looks at the run's slots until
 * last lap's consumers freed them all (they claimed them already, so this waits on no
 * blocked agent, as PUSH), then each work-item writes and publishes its slots. */
inline int wq_group_push(__global svmkit_wq *q, __local const WQ_ITEM *items, int n,
                         __local int *scratch)
{
    const int lid = (int)svmkit_wq_local_linear_id();
    const int size = (int)(get_local_size(0) * get_local_size(1) * get_local_size(2));
    const ulong cap = q->mask + 1;
    int done = 0, claimed = 0; /* claimed: the run the group holds, from pos */
    ulong pos = 0;
    for (;;) { /* one loop, each round a claim or a look at the run's slots */
        if (claimed == 0) {
            if (done >= n)
                break;
            /* The leader's claim: k positions from `first`, 0 full, -1 closed, -2 lost
             * the exchange (the last two: look again). */
            ulong first = 0;
            int k = 0;
            if (lid == 0) {
                first = svmkit_load_relaxed(&q->tail);
                if (first & SVMKIT_WQ_CLOSED) {
                    k = -1;
                } else {
                    long used = (long)(first - svmkit_load_acquire(&q->head));
                    if (used < 0) /* consumers claimed ahead (wq_pop): tail on is free */
                        used = 0;
                    if ((ulong)used < cap) {
                        ulong free = cap - (ulong)used;
                        if ((ulong)(n - done) < free)
                            free = (ulong)(n - done);
                        k = atomic_compare_exchange_strong_explicit(
                                &q->tail, &first, first + free, memory_order_relaxed,
                                memory_order_relaxed, SVMKIT_SCOPE)
                                ? (int)free
                                : -2;
                    }
                }
            }
            k = svmkit_wq_group_broadcast(scratch, lid, k);
            if (k == -1)
                break;
            if (k <= 0)
                continue;
            uint low = as_uint(svmkit_wq_group_broadcast(scratch, lid, as_int((uint)first)));
            uint high = as_uint(
                svmkit_wq_group_broadcast(scratch, lid, as_int((uint)(first >> 32))));
            pos = (ulong)high << 32 | low;
            claimed = k;
        }
        /* Are the run's slots free (last lap's consumers claimed them already)?  The first
         * that is not bounds *scratch. */
        barrier(CLK_LOCAL_MEM_FENCE); /* every work-item has read *scratch */
        if (lid == 0)
            *scratch = claimed;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int base = 0; base < claimed; base += size) {
            int i = base + lid;
            if (i < claimed && svmkit_load_acquire(svmkit_wq_seq(q, pos + i)) != pos + i)
                atomic_min(scratch, i);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (*scratch == claimed) {
            for (int base = 0; base < claimed; base += size) {
                int i = base + lid;
                if (i < claimed) {
                    *svmkit_wq_item(q, pos + i) = items[done + i];
                    svmkit_store_release(svmkit_wq_seq(q, pos + i), pos + i + 1);
                }
            }
            done += claimed;
            claimed = 0;
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return done;
}

/* Close from a device (as WorkQueue.close()): pushes fail, pops drain what is left. */
inline void wq_close(__global svmkit_wq *q)
{
    atomic_fetch_or_explicit(&q->tail, SVMKIT_WQ_CLOSED, memory_order_acq_rel, SVMKIT_SCOPE);
    svmkit_store_release(&q->closed, 1u);
}

#endif /* SVMKIT_WORKQUEUE_H */
