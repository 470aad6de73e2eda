/* GPU names and NVLinks from NVML, opened at run time: libnvidia-ml.so.1 ships with the driver, so
 * a machine whose GPUs can run has it, and the build needs neither it nor its header. The few types
 * used are declared here with the layouts of NVML's nvml.h (API version 2 and later). */
#define _GNU_SOURCE
#include "topo/internal.h"

#include "core/log.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvml_return;                    /* nvmlReturn_t */
typedef struct nvml_device_st *nvml_device; /* nvmlDevice_t */
typedef struct {                            /* nvmlPciInfo_t */
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} nvml_pci_info;

enum {
  NVML_OK = 0,
  NVML_ENABLED = 1,    /* nvmlEnableState_t NVML_FEATURE_ENABLED */
  NVML_MAX_LINKS = 18, /* NVML_NVLINK_MAX_LINKS (Hopper and Blackwell: 18) */
  NVML_REMOTE_GPU = 0, /* nvmlIntNvLinkDeviceType_t */
  NVML_REMOTE_SWITCH = 2,
};

struct nvml_api {
  nvml_return (*init)(void);
  nvml_return (*shutdown)(void);
  const char *(*error_string)(nvml_return);
  nvml_return (*driver_version)(char *, unsigned);
  nvml_return (*by_busid)(const char *, nvml_device *);
  nvml_return (*name)(nvml_device, char *, unsigned);
  nvml_return (*link_state)(nvml_device, unsigned, int *);
  nvml_return (*remote_pci)(nvml_device, unsigned, nvml_pci_info *);
  nvml_return (*remote_type)(nvml_device, unsigned, int *); /* optional: older drivers lack it */
};

static void set_status(tz_topo *t, const char *fmt, const char *a, const char *b) {
  char buf[256];
  snprintf(buf, sizeof buf, fmt, a, b);
  const char *s = topo_strdup(t, buf);
  if (s)
    t->machine.nvml = s;
}

static int resolve(void *lib, struct nvml_api *api, const char **missing) {
  static const struct {
    const char *name;
    size_t offset;
    int optional;
  } syms[] = {
      {"nvmlInit_v2", offsetof(struct nvml_api, init), 0},
      {"nvmlShutdown", offsetof(struct nvml_api, shutdown), 0},
      {"nvmlErrorString", offsetof(struct nvml_api, error_string), 0},
      {"nvmlSystemGetDriverVersion", offsetof(struct nvml_api, driver_version), 0},
      {"nvmlDeviceGetHandleByPciBusId_v2", offsetof(struct nvml_api, by_busid), 0},
      {"nvmlDeviceGetName", offsetof(struct nvml_api, name), 0},
      {"nvmlDeviceGetNvLinkState", offsetof(struct nvml_api, link_state), 0},
      {"nvmlDeviceGetNvLinkRemotePciInfo_v2", offsetof(struct nvml_api, remote_pci), 0},
      {"nvmlDeviceGetNvLinkRemoteDeviceType", offsetof(struct nvml_api, remote_type), 1},
  };
  memset(api, 0, sizeof *api);
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *f = dlsym(lib, syms[i].name);
    if (!f && !syms[i].optional) {
      *missing = syms[i].name;
      return -1;
    }
    /* dlsym returns object pointers; POSIX guarantees they convert to function pointers. */
    memcpy((char *)api + syms[i].offset, &f, sizeof f);
  }
  return 0;
}

/* Links of GPU i: to each other GPU directly (direct[i * n + j]) and to NVSwitches (*to_switch). */
static void count_links(const tz_topo *t, const struct nvml_api *api, nvml_device dev, int i,
                        int *direct, int *to_switch) {
  int n = t->n_gpus;
  for (unsigned l = 0; l < NVML_MAX_LINKS; l++) {
    int active = 0;
    if (api->link_state(dev, l, &active) != NVML_OK || active != NVML_ENABLED)
      continue;
    nvml_pci_info pci;
    memset(&pci, 0, sizeof pci);
    if (api->remote_pci(dev, l, &pci) != NVML_OK)
      continue;
    int peer = -1;
    for (int j = 0; j < n && peer < 0; j++) {
      unsigned dom, bus, d, fn;
      if (topo_parse_busid(t->gpus[j].busid, &dom, &bus, &d, &fn) == 0 && dom == pci.domain &&
          bus == pci.bus && d == pci.device)
        peer = j;
    }
    if (peer >= 0 && peer != i) {
      direct[i * n + peer]++;
      continue;
    }
    /* Not one of our GPUs: an NVSwitch (or, without the type query, assumed to be one: the other
     * remote kinds are IBM NPUs, links to POWER CPUs). */
    int type = NVML_REMOTE_SWITCH;
    if (api->remote_type && api->remote_type(dev, l, &type) != NVML_OK)
      type = NVML_REMOTE_SWITCH;
    if (type == NVML_REMOTE_SWITCH)
      (*to_switch)++;
  }
}

void topo_nvml(tz_topo *t) {
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    set_status(t, "not loaded (%s%s)", e ? e : "libnvidia-ml.so.1 not found", "");
    return;
  }
  struct nvml_api api;
  const char *missing = NULL;
  if (resolve(lib, &api, &missing) != 0) {
    set_status(t, "not used (libnvidia-ml.so.1 lacks %s%s)", missing, "");
    dlclose(lib);
    return;
  }
  nvml_return r = api.init();
  if (r != NVML_OK) {
    set_status(t, "not used (nvmlInit: %s%s)", api.error_string(r), "");
    dlclose(lib);
    return;
  }
  int n = t->n_gpus;
  int *direct = calloc((size_t)n * (size_t)n, sizeof *direct);
  int *to_switch = calloc((size_t)n, sizeof *to_switch);
  int *nvlinks = calloc((size_t)n * (size_t)n, sizeof *nvlinks);
  if (!direct || !to_switch || !nvlinks) {
    set_status(t, "not used (no memory%s%s)", "", "");
    goto out;
  }
  int found = 0, any_link = 0;
  for (int i = 0; i < n; i++) {
    nvml_device dev;
    if (api.by_busid(t->gpus[i].busid, &dev) != NVML_OK)
      continue;
    found++;
    char name[96];
    if (api.name(dev, name, sizeof name) == NVML_OK) {
      name[sizeof name - 1] = '\0';
      const char *s = topo_strdup(t, name);
      if (s) {
        t->gpus[i].name = s;
        t->gpus[i].name_source = "nvml";
      }
    }
    count_links(t, &api, dev, i, direct, &to_switch[i]);
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      if (i == j)
        continue;
      int d = direct[i * n + j] > direct[j * n + i] ? direct[i * n + j] : direct[j * n + i];
      int s = to_switch[i] < to_switch[j] ? to_switch[i] : to_switch[j];
      nvlinks[i * n + j] = d + s;
      any_link |= nvlinks[i * n + j] > 0;
    }
  char ver[96] = "";
  if (api.driver_version(ver, sizeof ver) != NVML_OK)
    snprintf(ver, sizeof ver, "unknown");
  ver[sizeof ver - 1] = '\0';
  char what[64];
  snprintf(what, sizeof what, "%d of %d GPUs", found, n);
  set_status(t, "driver %s, %s", ver, what);
  if (any_link) {
    t->nvlinks = nvlinks;
    nvlinks = NULL;
  }
out:
  free(direct);
  free(to_switch);
  free(nvlinks);
  api.shutdown();
  dlclose(lib);
}
