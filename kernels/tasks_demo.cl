/* Kernels of `svmkit demo tasks`: a task queue of the kind heterogeneous benchmark suites
 * publish.  A task is a record {int id; int op} (the prelude sk.WorkQueue.source_for(dtype)
 * declares WQ_ITEM) run by one work-group of TASK_GROUP work-items on the task's
 * TASK_GROUP ints of `data`: one read-modify-write pass for a light task (op 0),
 * HEAVY_PASSES for a heavy one (op 1).
 *
 * run_tasks: the persistent consumer.  Each work-group claims up to CLAIM tasks at once
 * (wq_group_pop into __local memory: the task pattern svmkit_workqueue.h recommends) and
 * runs them one after another with the whole group, until the queue is closed and drained.
 * run_batch: the same tasks as one launch per batch, one work-group per task.
 */
#ifndef TASK_GROUP
#define TASK_GROUP 64
#endif
#ifndef HEAVY_PASSES
#define HEAVY_PASSES 50
#endif
#ifndef CLAIM
#define CLAIM 64
#endif

inline void run_task(WQ_ITEM task, __global uint *data)
{
    __global uint *d = data + (size_t)task.id * TASK_GROUP;
    size_t i = get_local_id(0);
    int passes = task.op ? HEAVY_PASSES : 1;
    for (int p = 0; p < passes; p++)
        d[i] = d[i] * 1664525u + 1013904223u + (uint)p;
}

#ifndef TASKS_BATCH_ONLY
__kernel void run_tasks(__global svmkit_wq *tasks, __global uint *data)
{
    __local WQ_ITEM claim[CLAIM];
    __local int scratch;
    int k;
    while ((k = wq_group_pop(tasks, claim, CLAIM, &scratch)) > 0)
        for (int t = 0; t < k; t++)
            run_task(claim[t], data);
}
#endif

/* Work-group g runs tasks[first + g]. */
__kernel void run_batch(__global const WQ_ITEM *tasks, int first, __global uint *data)
{
    run_task(tasks[first + get_group_id(0)], data);
}
