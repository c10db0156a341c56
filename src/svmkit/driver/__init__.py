"""The driver floor: the only code that talks to OpenCL implementations directly.

* :mod:`~svmkit.driver.entrypoints`: ctypes bindings of the C entry points PyOpenCL lacks
  (``clSVMAlloc``, ``clSVMFree``, ``clSetKernelExecInfo``, an exact ``clEnqueueSVMMemFill``);
* :mod:`~svmkit.driver.icd_vendors`: ICD vendor files, so wheel-installed drivers are found;
* :mod:`~svmkit.driver.queues`: the default in-order queue per context;
* :mod:`~svmkit.driver.per_context`: a value made once per context.
"""
