"""svmkit on Dask: one context and pool per worker process, kernels mapped over chunks.

``pip install "svmkit[dask]"``.  :class:`SVMWorkerPlugin` sets each worker up,
:func:`map_kernel` runs an OpenCL kernel over the chunks of a Dask array and
:func:`worker_stats` reports each worker's pool.
"""

from svmkit.dask.map_kernel import map_kernel
from svmkit.dask.plugin import SVMWorkerPlugin
from svmkit.dask.programs import BuildError
from svmkit.dask.stats import worker_stats

__all__ = ["BuildError", "SVMWorkerPlugin", "map_kernel", "worker_stats"]
