/* GPU facts shared by the CUDA backends (util/gpu.h). */
#include "util/gpu.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

int tz_gpu_host_numa_node(int device) {
  int v = -1;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrHostNumaId, device) != cudaSuccess) {
    (void)cudaGetLastError();
    v = -1;
  }
  if (v >= 0)
    return v;
  char bus[32], path[96];
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  /* sysfs names PCI devices in lower case; the driver prints the bus id in upper case. */
  for (char *c = bus; *c; c++)
    if (*c >= 'A' && *c <= 'F')
      *c = (char)(*c - 'A' + 'a');
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  if (fscanf(f, "%d", &v) != 1)
    v = -1;
  fclose(f);
  return v;
}
