/* Facts about a GPU that more than one CUDA backend needs (the hbm tier, the cuda compute
 * backend), which may not call each other. CUDA builds only (tz_util_gpu). */
#ifndef TZ_UTIL_GPU_H
#define TZ_UTIL_GPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* The host NUMA node of GPU `device`: the driver's attribute, or on older drivers the PCI
 * device's node from sysfs; -1 when neither says. Clears the CUDA error it may leave. */
int tz_gpu_host_numa_node(int device);

#ifdef __cplusplus
}
#endif

#endif
