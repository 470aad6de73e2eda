/* What Linux says beyond hwloc: block devices and PCIe links from sysfs, mounts from mountinfo,
 * whether O_DIRECT opens on a filesystem, RLIMIT_MEMLOCK and transparent hugepages. Every sysfs
 * path is read below t->sysfs_root, so a tree saved from (or laid out like) another machine works.
 */
#define _GNU_SOURCE
#include "topo/internal.h"

#include "core/error.h"
#include "core/log.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

static void root_path(const tz_topo *t, char *out, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void root_path(const tz_topo *t, char *out, size_t len, const char *fmt, ...) {
  const char *root = t->sysfs_root && strcmp(t->sysfs_root, "/") != 0 ? t->sysfs_root : "";
  int n = snprintf(out, len, "%s", root);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < len)
    vsnprintf(out + n, len - (size_t)n, fmt, ap);
  va_end(ap);
}

/* The first line of a file without its newline; 0, or -1 when it cannot be read. */
static int read_line(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "re");
  if (!f)
    return -1;
  char *ok = fgets(buf, (int)len, f);
  fclose(f);
  if (!ok)
    return -1;
  size_t n = strlen(buf);
  while (n > 0 && isspace((unsigned char)buf[n - 1]))
    buf[--n] = '\0';
  size_t s = 0;
  while (isspace((unsigned char)buf[s]))
    s++;
  if (s)
    memmove(buf, buf + s, n - s + 1);
  return 0;
}

static long read_long(const char *path, long dflt) {
  char buf[64];
  if (read_line(path, buf, sizeof buf) != 0)
    return dflt;
  char *end;
  long v = strtol(buf, &end, 10);
  return end == buf ? dflt : v;
}

/* "32.0 GT/s PCIe" -> 5; 0 unknown. */
static int pcie_gen(const char *s) {
  double gts = atof(s);
  static const double rates[] = {2.5, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0};
  for (int i = 0; i < (int)(sizeof rates / sizeof rates[0]); i++)
    if (gts > rates[i] * 0.9 && gts < rates[i] * 1.1)
      return i + 1;
  return 0;
}

void topo_sysfs_pcie(const tz_topo *t, const char *busid, struct tz_topo_pcie *l) {
  if (!t->sysfs_root || !busid[0])
    return;
  char path[PATH_MAX], buf[64];
  root_path(t, path, sizeof path, "/sys/bus/pci/devices/%s/current_link_speed", busid);
  if (read_line(path, buf, sizeof buf) == 0)
    l->gen = pcie_gen(buf);
  root_path(t, path, sizeof path, "/sys/bus/pci/devices/%s/max_link_speed", busid);
  if (read_line(path, buf, sizeof buf) == 0)
    l->max_gen = pcie_gen(buf);
  root_path(t, path, sizeof path, "/sys/bus/pci/devices/%s/current_link_width", busid);
  l->width = (int)read_long(path, 0);
  root_path(t, path, sizeof path, "/sys/bus/pci/devices/%s/max_link_width", busid);
  l->max_width = (int)read_long(path, 0);
  if (l->width < 0 || l->width > 32)
    l->width = 0;
  if (l->max_width < 0 || l->max_width > 32)
    l->max_width = 0;
}

int topo_sysfs_numa_node(const tz_topo *t, const char *busid) {
  if (!t->sysfs_root || !busid[0])
    return -1;
  char path[PATH_MAX];
  root_path(t, path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", busid);
  long n = read_long(path, -1);
  return n >= 0 && n < TZ_CPUSET_MAX ? (int)n : -1;
}

static int is_busid(const char *s) {
  unsigned a, b, c, d;
  return strlen(s) == 12 && topo_parse_busid(s, &a, &b, &c, &d) == 0;
}

/* The PCI function a block device hangs off: the last bus id in its resolved sysfs path
 * (/sys/devices/pci0000:00/0000:00:1d.0/0000:01:00.0/nvme/nvme0/nvme0n1 -> 0000:01:00.0). */
static void block_busid(const tz_topo *t, const char *name, char out[16]) {
  out[0] = '\0';
  char path[PATH_MAX];
  root_path(t, path, sizeof path, "/sys/block/%s", name);
  char *real = realpath(path, NULL);
  if (!real)
    return;
  for (char *tok = strtok(real, "/"); tok; tok = strtok(NULL, "/"))
    if (is_busid(tok))
      snprintf(out, 16, "%s", tok);
  free(real);
}

static int skip_block(const char *name) {
  static const char *const skip[] = {"loop", "ram", "zram", "fd", "sr", "nbd", "zd"};
  for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
    if (strncmp(name, skip[i], strlen(skip[i])) == 0)
      return 1;
  return 0;
}

static int cmp_name(const void *a, const void *b) {
  return strverscmp(*(char *const *)a, *(char *const *)b);
}

/* name is disk or one of its partitions: nvme0n1 / nvme0n1p2, sda / sda1, mmcblk0 / mmcblk0p1. */
static int is_part_of(const char *name, const char *disk) {
  size_t n = strlen(disk);
  if (strncmp(name, disk, n) != 0)
    return 0;
  const char *r = name + n;
  if (*r == '\0')
    return 1;
  if (*r == 'p' && isdigit((unsigned char)disk[n - 1]))
    r++;
  if (!*r)
    return 0;
  for (; *r; r++)
    if (!isdigit((unsigned char)*r))
      return 0;
  return 1;
}

static int find_disk_of(const tz_topo *t, const char *name) {
  for (int i = 0; i < t->n_blockdevs; i++)
    if (is_part_of(name, t->blockdevs[i].name))
      return i;
  return -1;
}

int topo_sysfs_blockdevs(tz_topo *t) {
  char path[PATH_MAX];
  root_path(t, path, sizeof path, "/sys/block");
  DIR *d = opendir(path);
  if (!d) {
    /* A machine without /sys/block (a container without sysfs) has no block devices to show. */
    TZ_DEBUG("topo: %s: %s", path, strerror(errno));
    t->blockdevs = topo_keep(t, calloc(1, sizeof *t->blockdevs));
    return t->blockdevs ? 0 : tz_err_set(TZ_ENOMEM, "topo: no memory");
  }
  char **names = NULL;
  int n = 0, cap = 0, rc = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.' || skip_block(e->d_name))
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 32;
      char **nn = realloc(names, (size_t)cap * sizeof *nn);
      if (!nn) {
        rc = tz_err_set(TZ_ENOMEM, "topo: no memory for block devices");
        goto out;
      }
      names = nn;
    }
    if (!(names[n] = strdup(e->d_name))) {
      rc = tz_err_set(TZ_ENOMEM, "topo: no memory for block devices");
      goto out;
    }
    n++;
  }
  qsort(names, (size_t)n, sizeof *names, cmp_name);
  t->blockdevs = topo_keep(t, calloc((size_t)n + 1, sizeof *t->blockdevs));
  t->blockdev_obj = topo_keep(t, calloc((size_t)n + 1, sizeof *t->blockdev_obj));
  t->blockdev_devno = topo_keep(t, calloc((size_t)n + 1, sizeof *t->blockdev_devno));
  if (!t->blockdevs || !t->blockdev_obj || !t->blockdev_devno) {
    rc = tz_err_set(TZ_ENOMEM, "topo: no memory for %d block devices", n);
    goto out;
  }
  /* Hardware first (a "device" link), then md and dm devices built on them. */
  for (int pass = 0; pass < 2; pass++) {
    for (int k = 0; k < n; k++) {
      const char *name = names[k];
      char buf[256];
      struct stat st;
      root_path(t, path, sizeof path, "/sys/block/%s/device", name);
      int hardware = stat(path, &st) == 0;
      if ((pass == 0) != hardware)
        continue;
      int members[64], n_members = 0;
      if (!hardware) {
        root_path(t, path, sizeof path, "/sys/block/%s/slaves", name);
        DIR *sd = opendir(path);
        if (!sd)
          continue;
        for (struct dirent *e; (e = readdir(sd)) && n_members < 64;) {
          if (e->d_name[0] == '.')
            continue;
          int m = find_disk_of(t, e->d_name);
          int dup = 0;
          for (int j = 0; j < n_members; j++)
            dup |= members[j] == m;
          if (m >= 0 && !dup)
            members[n_members++] = m;
        }
        closedir(sd);
        if (n_members == 0)
          continue;
      }
      int i = t->n_blockdevs++;
      struct tz_topo_blockdev *b = &t->blockdevs[i];
      b->name = topo_strdup(t, name);
      b->numa_node = b->package = -1;
      root_path(t, path, sizeof path, "/sys/block/%s/size", name);
      long long sectors = 0;
      if (read_line(path, buf, sizeof buf) == 0)
        sectors = atoll(buf);
      b->size_bytes = sectors > 0 ? (uint64_t)sectors * 512 : 0; /* always 512-byte units */
      root_path(t, path, sizeof path, "/sys/block/%s/queue/rotational", name);
      b->rotational = (int)read_long(path, -1);
      if (b->rotational != 0 && b->rotational != 1)
        b->rotational = -1;
      root_path(t, path, sizeof path, "/sys/block/%s/dev", name);
      if (read_line(path, t->blockdev_devno[i], sizeof t->blockdev_devno[i]) != 0)
        t->blockdev_devno[i][0] = '\0';
      buf[0] = '\0';
      root_path(t, path, sizeof path, "/sys/block/%s/device/model", name);
      if (read_line(path, buf, sizeof buf) != 0) {
        root_path(t, path, sizeof path, "/sys/block/%s/md/level", name);
        if (read_line(path, buf, sizeof buf) != 0)
          buf[0] = '\0';
      }
      b->model = topo_strdup(t, buf);
      if (hardware) {
        block_busid(t, name, b->busid);
        hwloc_obj_t pci = b->busid[0] ? hwloc_get_pcidev_by_busidstring(t->hw, b->busid) : NULL;
        t->blockdev_obj[i] = pci;
        b->kind = topo_disk_kind(name, pci);
        if (pci) {
          topo_locality(t, pci, &b->numa_node, &b->package, NULL);
          b->link.bandwidth_gbs = pci->attr->pcidev.linkspeed;
        } else if (b->busid[0]) {
          b->numa_node = topo_sysfs_numa_node(t, b->busid);
          if (b->numa_node < 0 && t->n_numa == 1)
            b->numa_node = t->numa[0].os_index;
        }
        topo_sysfs_pcie(t, b->busid, &b->link);
      } else {
        b->kind = topo_disk_kind(name, NULL);
        int *m = topo_keep(t, malloc((size_t)n_members * sizeof *m));
        if (!m) {
          rc = tz_err_set(TZ_ENOMEM, "topo: no memory");
          goto out;
        }
        memcpy(m, members, (size_t)n_members * sizeof *m);
        b->members = m;
        b->n_members = n_members;
        /* Local to a node only when every member is. */
        b->numa_node = t->blockdevs[m[0]].numa_node;
        b->package = t->blockdevs[m[0]].package;
        for (int j = 1; j < n_members; j++) {
          if (t->blockdevs[m[j]].numa_node != b->numa_node)
            b->numa_node = -1;
          if (t->blockdevs[m[j]].package != b->package)
            b->package = -1;
        }
        b->rotational = t->blockdevs[m[0]].rotational;
      }
      if (!b->name || !b->model) {
        rc = tz_err_set(TZ_ENOMEM, "topo: no memory");
        goto out;
      }
    }
  }
out:
  closedir(d);
  for (int k = 0; k < n; k++)
    free(names[k]);
  free(names);
  return rc;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s) {
  char *w = s;
  for (char *r = s; *r;) {
    if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' &&
        r[3] <= '7') {
      *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
      r += 4;
    } else {
      *w++ = *r++;
    }
  }
  *w = '\0';
}

/* The block device a mount's device number or source belongs to, or -1. */
static int mount_blockdev(const tz_topo *t, unsigned major, unsigned minor, const char *source) {
  char devno[32];
  snprintf(devno, sizeof devno, "%u:%u", major, minor);
  for (int i = 0; i < t->n_blockdevs; i++)
    if (strcmp(t->blockdev_devno[i], devno) == 0)
      return i;
  if (t->sysfs_root) {
    /* A partition: /sys/dev/block/259:3 -> .../nvme0n1/nvme0n1p2, whose parent is the disk. */
    char path[PATH_MAX];
    root_path(t, path, sizeof path, "/sys/dev/block/%s", devno);
    char *real = realpath(path, NULL);
    if (real) {
      int found = -1;
      for (char *tok = strtok(real, "/"); tok; tok = strtok(NULL, "/")) {
        int b = tz_topo_blockdev_find(t, tok);
        if (b >= 0)
          found = b;
      }
      free(real);
      if (found >= 0)
        return found;
    }
  }
  if (strncmp(source, "/dev/", 5) == 0) {
    const char *name = source + 5;
    if (strncmp(name, "mapper/", 7) == 0)
      return -1;
    return find_disk_of(t, name);
  }
  return -1;
}

int topo_read_mountinfo(tz_topo *t, const char *path) {
  FILE *f = fopen(path, "re");
  if (!f)
    return tz_err_errno(errno, "topo: mountinfo %s", path);
  struct tz_topo_mount *mounts = NULL;
  int n = 0, cap = 0, rc = 0, lineno = 0;
  char *line = NULL;
  size_t line_cap = 0;
  while (getline(&line, &line_cap, f) > 0) {
    lineno++;
    /* id parent major:minor root mount-point options [optional fields] - fstype source super */
    char *fields[64];
    int nf = 0;
    for (char *save = NULL, *tok = strtok_r(line, " \n", &save); tok && nf < 64;
         tok = strtok_r(NULL, " \n", &save))
      fields[nf++] = tok;
    int dash = -1;
    for (int i = 6; i < nf && dash < 0; i++)
      if (strcmp(fields[i], "-") == 0)
        dash = i;
    unsigned major, minor;
    if (nf < 6 || dash < 0 || dash + 2 >= nf || sscanf(fields[2], "%u:%u", &major, &minor) != 2) {
      rc = tz_err_set(TZ_EFORMAT, "topo: %s:%d: not a mountinfo line", path, lineno);
      goto out;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      struct tz_topo_mount *m = realloc(mounts, (size_t)cap * sizeof *m);
      if (!m) {
        rc = tz_err_set(TZ_ENOMEM, "topo: no memory for mounts");
        goto out;
      }
      mounts = m;
    }
    unescape(fields[4]);
    unescape(fields[dash + 2]);
    struct tz_topo_mount *m = &mounts[n++];
    memset(m, 0, sizeof *m);
    m->path = topo_strdup(t, fields[4]);
    m->fstype = topo_strdup(t, fields[dash + 1]);
    m->source = topo_strdup(t, fields[dash + 2]);
    m->major = major;
    m->minor = minor;
    m->read_only =
        strncmp(fields[5], "ro", 2) == 0 && (fields[5][2] == '\0' || fields[5][2] == ',');
    m->blockdev = mount_blockdev(t, major, minor, fields[dash + 2]);
    m->odirect = -1;
    if (!m->path || !m->fstype || !m->source) {
      rc = tz_err_set(TZ_ENOMEM, "topo: no memory for mounts");
      goto out;
    }
  }
  if (!(t->mounts = topo_keep(t, mounts ? mounts : calloc(1, sizeof *mounts)))) {
    mounts = NULL;
    rc = tz_err_set(TZ_ENOMEM, "topo: no memory for mounts");
    goto out;
  }
  mounts = NULL;
  t->n_mounts = n;
  for (int b = 0; b < t->n_blockdevs; b++) {
    int k = 0;
    for (int i = 0; i < n; i++)
      k += t->mounts[i].blockdev == b;
    if (!k)
      continue;
    int *list = topo_keep(t, malloc((size_t)k * sizeof *list));
    if (!list) {
      rc = tz_err_set(TZ_ENOMEM, "topo: no memory for mounts");
      goto out;
    }
    k = 0;
    for (int i = 0; i < n; i++)
      if (t->mounts[i].blockdev == b)
        list[k++] = i;
    t->blockdevs[b].mounts = list;
    t->blockdevs[b].n_mounts = k;
  }
out:
  free(mounts);
  free(line);
  fclose(f);
  return rc;
}

/* 1 when a file opens with O_DIRECT in dir, 0 when the filesystem refuses it, -1 unknown. */
static int odirect_works(const char *dir) {
  int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    return 1;
  }
  if (errno == EINVAL)
    return 0;
  if (errno != EOPNOTSUPP && errno != EISDIR)
    return -1; /* EACCES, EROFS, ...: cannot tell */
  /* No O_TMPFILE here: a named file, removed at once. */
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/.tz-odirect-%ld", dir, (long)getpid());
  fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    unlink(path);
    return 1;
  }
  return errno == EINVAL ? 0 : -1;
}

void topo_probe_odirect(tz_topo *t) {
  for (int i = 0; i < t->n_mounts; i++) {
    struct tz_topo_mount *m = &t->mounts[i];
    /* Local disks and tmpfs only: a network filesystem may hang, pseudo ones hold no files. */
    if (m->read_only || (m->blockdev < 0 && strcmp(m->fstype, "tmpfs") != 0))
      continue;
    if (access(m->path, W_OK) != 0)
      continue;
    m->odirect = odirect_works(m->path);
  }
}

int64_t topo_live_memlock(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_MEMLOCK, &r) != 0)
    return TZ_TOPO_FACT_LIVE;
  return r.rlim_cur == RLIM_INFINITY ? TZ_TOPO_UNLIMITED : (int64_t)r.rlim_cur;
}

int topo_live_cap_ipc_lock(void) {
  FILE *f = fopen("/proc/self/status", "re");
  if (!f)
    return TZ_TOPO_FACT_LIVE;
  char line[256];
  int r = TZ_TOPO_FACT_LIVE;
  while (fgets(line, sizeof line, f)) {
    unsigned long long caps;
    if (sscanf(line, "CapEff: %llx", &caps) == 1) {
      r = (int)((caps >> 14) & 1); /* CAP_IPC_LOCK is capability 14 */
      break;
    }
  }
  fclose(f);
  return r;
}

const char *topo_live_thp(void) {
  char buf[128];
  if (read_line("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof buf) != 0)
    return NULL;
  /* "always [madvise] never": the bracketed word is the mode. */
  if (strstr(buf, "[always]"))
    return "always";
  if (strstr(buf, "[madvise]"))
    return "madvise";
  if (strstr(buf, "[never]"))
    return "never";
  return NULL;
}
