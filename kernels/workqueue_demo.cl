/* Kernels of `svmkit demo workqueue`: Collatz stopping times, an irregular workload (a
 * number below 2^20 takes anywhere from 0 to several hundred steps).
 *
 * collatz_consumer: persistent consumer (one work-item per work-group, see
 * sk.persistent_grid).  Pops indices the host pushes into `work`, reports each index on
 * `popped` at once (the host stamps push->pop latency from it), then computes.
 * collatz_batch: the same work as one static launch per batch (the comparison, and the
 * mode used on devices without fine-grain SVM atomics; build it alone with
 * -DSVMKIT_DEMO_BATCH_ONLY, which needs no atomics).
 */
#ifndef SVMKIT_DEMO_BATCH_ONLY
#include "svmkit_workqueue.h"
#endif

inline int collatz_steps(long n)
{
    int steps = 0;
    while (n > 1) {
        n = (n & 1) ? 3 * n + 1 : n >> 1;
        steps++;
    }
    return steps;
}

#ifndef SVMKIT_DEMO_BATCH_ONLY
/* Pops runs of up to 8 indices with one atomic per run. */
__kernel void collatz_consumer(__global svmkit_wq *work, __global svmkit_wq *popped,
                               __global const long *starts, __global int *steps)
{
    WQ_ITEM idx[8];
    int k;
    while ((k = wq_pop_many(work, idx, 8))) {
        for (int j = 0; j < k; j++)
            wq_push(popped, idx[j]);
        for (int j = 0; j < k; j++)
            steps[idx[j]] = collatz_steps(starts[idx[j]]);
    }
}
#endif

__kernel void collatz_batch(__global const long *starts, __global int *steps)
{
    size_t i = get_global_id(0);
    steps[i] = collatz_steps(starts[i]);
}
