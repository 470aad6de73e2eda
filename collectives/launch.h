/* Launch and bootstrap: how a worker learns its place in the world, how rank 0 hands a small blob
 * (the NCCL unique id) to the other ranks before any communicator exists, and how one program
 * starts N workers on one machine and watches them.
 *
 * Where the world comes from, in this order of precedence (tz_bootstrap_detect):
 *   TZ_RANK, TZ_WORLD_SIZE, TZ_LOCAL_RANK     a worker of tz_launch_nproc (pipes to the parent)
 *   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*    torchrun and the like (TCP to MASTER_ADDR)
 *   OMPI_COMM_WORLD_RANK / PMI_RANK ...       mpirun (MPI, or TCP when MASTER_ADDR is set)
 *   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID srun steps (TCP; the address defaults to the
 *                                             first node of the step)
 *   nothing                                   a world of one
 * So a multi-node run needs no tool beyond the cluster's own launcher. */
#ifndef TZ_LAUNCH_H
#define TZ_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tz_launch_kind {
  TZ_LAUNCH_SINGLE,   /* no launcher: a world of one */
  TZ_LAUNCH_NPROC,    /* a worker started by tz_launch_nproc */
  TZ_LAUNCH_TORCHRUN, /* RANK / WORLD_SIZE variables */
  TZ_LAUNCH_MPIRUN,   /* Open MPI's or a PMI launcher's variables */
  TZ_LAUNCH_SLURM,    /* an srun step */
};
const char *tz_launch_kind_name(enum tz_launch_kind k); /* "single", "nproc", ... */

struct tz_bootstrap {
  enum tz_launch_kind kind;
  int rank, size;             /* in the whole job */
  int local_rank, local_size; /* on this machine; the GPU a worker binds to is local_rank */
  char master_addr[256];      /* TCP rendezvous with rank 0; "" when none */
  int master_port;
  int fd_from_parent; /* nproc: the relay pipes to tz_launch_nproc's parent; -1 else */
  int fd_to_parent;
  double timeout_s; /* limit on each exchange: $TZ_COMM_TIMEOUT, default 300 */
  uint32_t seq;     /* exchanges done so far; every rank makes them in the same order */
  /* optional: NULL means use the channel above. The comm registry plugs an MPI broadcast in here
   * for mpirun launches without MASTER_ADDR. */
  int (*bcast_fn)(void *arg, void *buf, size_t len);
  void *bcast_arg;
};

/* Fills bs from the environment (above). TZ_ECONFIG with the variable's name when a variable is
 * malformed or inconsistent (RANK=5 with WORLD_SIZE=4). */
int tz_bootstrap_detect(struct tz_bootstrap *bs);

/* A world of one with no channel, for tests and single-process use. */
void tz_bootstrap_single(struct tz_bootstrap *bs);

/* 1 when tz_bootstrap_bcast can work (a world of one, a relay pipe, a TCP address or bcast_fn). */
int tz_bootstrap_has_channel(const struct tz_bootstrap *bs);

/* Every rank calls this with the same len; rank 0's buf is copied into everyone else's. Blocks
 * until done or bs->timeout_s passes (TZ_ETIMEDOUT naming the ranks that never arrived, when rank 0
 * can tell). len is at most TZ_BOOTSTRAP_MAX_BLOB. TZ_ENOTSUP when there is no channel. */
#define TZ_BOOTSTRAP_MAX_BLOB 4000
int tz_bootstrap_bcast(struct tz_bootstrap *bs, void *buf, size_t len);

/* ---- Starting workers on this machine ---- */

/* 1 in a process that tz_launch_nproc started (TZ_RANK is set): such a process must not launch
 * again. A main does: if (nproc > 1 && !tz_launch_is_worker()) return tz_launch_nproc(...) ...; */
int tz_launch_is_worker(void);

struct tz_launch_params {
  int nproc;      /* workers to start, >= 1 */
  double grace_s; /* SIGTERM to SIGKILL when stopping the others; default 5 */
  /* optional: NULL means inherit the parent's CPU set. Otherwise nproc Linux cpu lists
   * ("0-15,32-47"), one per local rank, as the topology advice gives them. */
  const char *const *cpulists;
};
void tz_launch_params_init(struct tz_launch_params *lp);

struct tz_launch_result {
  int failed_rank; /* the first rank that failed, -1 when none did */
  int exit_status; /* its exit status, -1 if a signal ended it */
  int signal;      /* the signal that ended it, 0 if none */
  int exit_code;   /* what a main should return: 0, the failed rank's status, or 128 + signal */
};

/* Re-executes /proc/self/exe with argv nproc times, each worker with TZ_RANK, TZ_WORLD_SIZE,
 * TZ_LOCAL_RANK, TZ_LOCAL_WORLD_SIZE, the relay pipes (TZ_BOOTSTRAP_FDS) and NCCL_NVLS_ENABLE=0
 * unless set, bound to its CPU list, and killed if this process dies. Then relays rank 0's
 * bootstrap blobs to the others and waits. When a worker dies or exits non-zero, logs
 * "rank 1 died (signal 9: Killed)" or "rank 1 exited with status 3", sends SIGTERM to the others
 * and SIGKILL after grace_s. SIGINT, SIGTERM and SIGHUP sent to this process are passed on.
 * Returns 0 when every worker exited 0; TZ_ECOMM (message as logged) when one failed; other codes
 * when they could not be started. res may be NULL. */
int tz_launch_run(const struct tz_launch_params *lp, int argc, char **argv,
                  struct tz_launch_result *res);

/* tz_launch_run with defaults, returning the exit code for main (0 when every worker succeeded). */
int tz_launch_nproc(int n, int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
