"""The fine-grain atomic work queue that host threads and running kernels share.

* :mod:`~svmkit.workqueue.queue`: :class:`WorkQueue`, the host side;
* :mod:`~svmkit.workqueue.items`: the item types (numbers, records) and their C prelude;
* :mod:`~svmkit.workqueue.ring`: the ring's host operations (C, else Python);
* ``kernels/svmkit_workqueue.h``: the device side, same memory layout.
"""

from svmkit.workqueue.queue import WorkQueue, WorkQueueTimeout, opencl_type, persistent_grid

__all__ = ["WorkQueue", "WorkQueueTimeout", "opencl_type", "persistent_grid"]
