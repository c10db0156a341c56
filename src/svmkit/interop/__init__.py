"""Interop: SVM arrays in NumPy, DLPack, pickle and ``pyopencl.array`` code.

* :mod:`~svmkit.interop.numpy_protocol`: NumPy on SVM memory: operands, results, ufuncs
  and the operators' fast path, ``__array__`` and ``__array_interface__``;
* :mod:`~svmkit.interop.numpy_surface`: NumPy's whole ``ndarray`` surface, installed on
  ``SVMArray`` from one table (methods, attributes, operators, ``__array_function__``,
  indexing, ``repr``);
* :mod:`~svmkit.interop.dlpack`: the DLPack producer (``__dlpack__``, ``__dlpack_device__``);
* :mod:`~svmkit.interop.importing`: ``sk.asarray`` of DLPack and buffer-protocol objects;
* :mod:`~svmkit.interop.pickling`: ``copy``, ``deepcopy`` and pickling;
* :mod:`~svmkit.interop.cl_array`: ``pyopencl.array`` bridges and ``sk.cl_allocator``.

These modules only create exports; what keeps memory alive is
:mod:`svmkit.resources.exports`.
"""
