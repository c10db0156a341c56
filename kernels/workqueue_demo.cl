/* Kernels of `svmkit demo workqueue`: Collatz stopping times, an irregular workload (a
 * number below 2^20 takes anywhere from 0 to several hundred steps).
 *
 * collatz_group: the persistent consumer.  Each work-group's leader claims a run of up to
 * DEMO_BATCH indices from `work` into local memory (wq_group_pop), the whole group computes
 * them, and the leader pushes the results, (index << 32) | steps, to `results`
 * (wq_group_push), which the host pops: host -> device -> host through two queues.
 * collatz_item: the single-item consumer the latency measure uses (one work-item, wq_pop).
 * collatz_launch: the same work as one launch per batch (the comparison, and the mode used
 * on devices without fine-grain SVM atomics; build it alone with -DSVMKIT_DEMO_BATCH_ONLY,
 * which needs no atomics).
 */
#ifndef SVMKIT_DEMO_BATCH_ONLY
#include "svmkit_workqueue.h"
#endif

#ifndef DEMO_BATCH
#define DEMO_BATCH 64
#endif

inline long collatz_steps(long n)
{
    long steps = 0;
    while (n > 1) {
        n = (n & 1) ? 3 * n + 1 : n >> 1;
        steps++;
    }
    return steps;
}

#ifndef SVMKIT_DEMO_BATCH_ONLY
/* The latency consumer: one work-item alone in its work-group pops single items (wq_pop),
 * with no barrier between an item's arrival and its result. */
__kernel void collatz_item(__global svmkit_wq *work, __global svmkit_wq *results,
                           __global const long *starts)
{
    WQ_ITEM index;
    while (wq_pop(work, &index)) {
        if (!wq_push(results, (index << 32) | collatz_steps(starts[index])))
            break;
    }
}

__kernel void collatz_group(__global svmkit_wq *work, __global svmkit_wq *results,
                            __global const long *starts)
{
    __local WQ_ITEM in[DEMO_BATCH];
    __local WQ_ITEM out[DEMO_BATCH];
    __local int scratch;
    int k;
    while ((k = wq_group_pop(work, in, DEMO_BATCH, &scratch)) > 0) {
        for (int i = get_local_id(0); i < k; i += get_local_size(0))
            out[i] = (in[i] << 32) | collatz_steps(starts[in[i]]);
        if (wq_group_push(results, out, k, &scratch) < k)
            break;
    }
}
#endif

/* One launch per batch: work-item i computes batch[i] (an index into starts). */
__kernel void collatz_launch(__global const long *batch, __global const long *starts,
                             __global long *out)
{
    size_t i = get_global_id(0);
    long idx = batch[i];
    out[i] = (idx << 32) | collatz_steps(starts[idx]);
}
