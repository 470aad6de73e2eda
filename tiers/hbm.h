/* hbm: one GPU's memory as a tier (DESIGN.md). What clients need beyond the tier interface: making
 * a CUDA stream (the compute lane) wait on a fence without the host, the GPU's NUMA node for
 * placing host tiers, and counters. Built only with the CUDA toolkit (tiers/CMakeLists.txt). */
#ifndef TZ_TIERS_HBM_H
#define TZ_TIERS_HBM_H

#include <stddef.h>
#include <stdint.h>

#include "core/fence.h"
#include "core/lane.h"
#include "core/tier.h"

/* Makes cuda_stream (a cudaStream_t; NULL is the legacy default stream) wait for f on the device,
 * with cudaStreamWaitEvent, never on the host:
 * - f is the fence of an hbm copy, or of a transfer around one (tz_transfer with a host side):
 *   the stream waits on its event. Returns 0.
 * - f is complete and ok: nothing to wait for. Returns 0.
 * - f is complete with an error: returns that error with f's message.
 * - f is any other pending fence (an nvme read, a staged transfer, tz_fence_all): a stream cannot
 *   wait on host work. Returns TZ_EINVAL with a message; nothing is enqueued. Hand the stream the
 *   fence of the host->hbm copy that follows such work instead (DESIGN.md).
 * hbm is the tier whose GPU the stream belongs to; TZ_EINVAL when it is not an hbm tier. */
int tz_hbm_stream_wait(tz_tier *hbm, tz_fence *f, void *cuda_stream);

/* A compute lane that is a CUDA stream of hbm's GPU (tiers/hbm_lane.c), for tz_sched_params.lane.
 * - wait: cudaStreamWaitEvent on each fence's event (tz_hbm_stream_wait); a pending host fence is
 *   refused with TZ_EINVAL and nothing is enqueued.
 * - submit(fn): runs fn(arg) at once on the calling thread to *launch* work on the stream
 *   (tz_lane_native(lane) is the cudaStream_t); fn must not wait for the GPU. A failing fn, or a
 *   failed input, poisons the lane: later fns are not run and later fences fail.
 * - record: a CUDA event polled by the progress engine; a device stream (tz_hbm_stream_wait) can
 *   wait on it. It completes with an error when an input the lane waited on failed.
 * - stall: timed with CUDA events recorded before and after a wait (cudaEventElapsedTime), read
 *   when the next recorded fence completes.
 * - order (tz_lane_order between two such lanes): an event recorded on one stream that the other
 *   waits for with cudaStreamWaitEvent; no host fence.
 * - timing marks (tz_lane_timer_*): CUDA timing events recorded on the stream.
 * The same lane is what tz_lane_create_device (core/lane.h) gives for an hbm tier.
 * hbm must outlive the lane. *out is owned by the caller (tz_lane_destroy). */
int tz_hbm_lane_create(tz_tier *hbm, tz_lane **out);
/* The same lane on the caller's stream (a cudaStream_t of hbm's GPU), which stays the caller's
 * and must outlive the lane: work that others enqueue on it (a comm's collectives, say) is then
 * ordered with the lane's by the stream itself. */
int tz_hbm_lane_create_on(tz_tier *hbm, void *cuda_stream, tz_lane **out);

/* Whether GPUDirect Storage could be used on this machine: 1 when libcufile loads, the nvidia-fs
 * module is present and cuFileDriverOpen succeeds, else 0; why[] says which step failed. Decided
 * once per process. tierzero stages nvme<->hbm through pinned host memory either way (it has no
 * direct path; docs/hbm.md). */
int tz_hbm_gds_usable(char *why, size_t why_len);

struct tz_hbm_stats {
  int device;
  uint64_t events_at_init; /* CUDA events created with the tier */
  uint64_t events_created; /* all CUDA events created, those at init included */
  uint64_t events_in_use;  /* held by fences not yet released */
  uint64_t h2d_copies, d2h_copies, d2d_copies;
  uint64_t pageable_copies; /* slow path: the host buffer was not page-locked */
  uint64_t stream_waits;    /* tz_hbm_stream_wait calls that enqueued cudaStreamWaitEvent */
  uint64_t waits_done;      /* tz_hbm_stream_wait calls whose fence had completed: no wait */
  uint64_t pinned_arenas;   /* host arenas registered with this GPU and still registered */
  uint64_t pinned_bytes;    /* bytes this tier page-locked itself (cudaHostRegister), in all */
  double pin_seconds;       /* time those cudaHostRegister calls took */
};
/* TZ_EINVAL when t is not an hbm tier. */
int tz_hbm_stats(tz_tier *t, struct tz_hbm_stats *out);

/* Seconds cudaHostRegister took per GiB over the arenas this tier page-locked; 0 if none. */
double tz_hbm_pin_seconds_per_gib(tz_tier *t);

#endif
