/* svmkit_atomics.h - SVM atomics with the widest memory scope the device supports.
 *
 * Fine-grain SVM with CL_MEM_SVM_ATOMICS lets the host and every device of a context update
 * the same words.  The scope that makes an atomic visible to all of them is
 * memory_scope_all_svm_devices; OpenCL C 3.0 makes it optional (feature
 * __opencl_c_atomic_scope_all_devices), so a device without it gets memory_scope_device,
 * which on such a device still covers the host in practice (PoCL's CPU device shares the
 * host's coherent memory).  svmkit.build_program defines SVMKIT_SCOPE for every device of
 * the context; the fallback below serves builds made without it.
 */
#ifndef SVMKIT_ATOMICS_H
#define SVMKIT_ATOMICS_H

#ifndef SVMKIT_SCOPE
#  if defined(__opencl_c_atomic_scope_all_devices) || \
      (defined(__OPENCL_C_VERSION__) && __OPENCL_C_VERSION__ >= 200 && __OPENCL_C_VERSION__ < 300)
#    define SVMKIT_SCOPE memory_scope_all_svm_devices
#  else
#    define SVMKIT_SCOPE memory_scope_device
#  endif
#endif

#define svmkit_load_relaxed(p)      atomic_load_explicit((p), memory_order_relaxed, SVMKIT_SCOPE)
#define svmkit_load_acquire(p)      atomic_load_explicit((p), memory_order_acquire, SVMKIT_SCOPE)
#define svmkit_store_relaxed(p, v)  atomic_store_explicit((p), (v), memory_order_relaxed, SVMKIT_SCOPE)
#define svmkit_store_release(p, v)  atomic_store_explicit((p), (v), memory_order_release, SVMKIT_SCOPE)
#define svmkit_fetch_add(p, v)      atomic_fetch_add_explicit((p), (v), memory_order_acq_rel, SVMKIT_SCOPE)
#define svmkit_cas(p, expected, desired) \
    atomic_compare_exchange_weak_explicit((p), (expected), (desired), \
        memory_order_acq_rel, memory_order_relaxed, SVMKIT_SCOPE)

#endif /* SVMKIT_ATOMICS_H */
