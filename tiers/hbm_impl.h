/* Private to tiers/hbm*.c: a stream of an hbm tier's GPU whose recorded events are fences of the
 * same kind as the tier's copies, so tz_hbm_stream_wait (and another stream) can wait on them on
 * the device. The CUDA-stream lane (tiers/hbm_lane.c) is built on it. */
#ifndef TZ_TIERS_HBM_IMPL_H
#define TZ_TIERS_HBM_IMPL_H

#include "core/fence.h"
#include "core/tier.h"

struct tz_hbm_stream;

/* A non-blocking stream on hbm's GPU. TZ_EINVAL when hbm is not an hbm tier. The tier must
 * outlive the stream. */
int tz_hbm_stream_create(tz_tier *hbm, struct tz_hbm_stream **out);
/* The same around the caller's stream (a cudaStream_t of hbm's GPU, not NULL), which stays the
 * caller's: destroying the wrapper waits for it but does not destroy it. */
int tz_hbm_stream_adopt(tz_tier *hbm, void *cuda_stream, struct tz_hbm_stream **out);
/* Waits until everything enqueued has run and every fence recorded on it has completed (the
 * progress engine polls them), then destroys the stream. NULL is a no-op. */
void tz_hbm_stream_destroy(struct tz_hbm_stream *st);
/* The cudaStream_t. */
void *tz_hbm_stream_handle(struct tz_hbm_stream *st);
/* The GPU the stream runs on. */
int tz_hbm_stream_device(const struct tz_hbm_stream *st);
/* Records a pooled event at the stream's current end; *out (owned by the caller) completes when
 * the GPU reaches it, polled by the progress engine. `what` names the work it ends, in errors. */
int tz_hbm_stream_record(struct tz_hbm_stream *st, const char *what, tz_fence **out);

/* 1 when a device stream can wait for f without the host: f is complete, or is (or forwards) the
 * fence of a copy or of a record on some stream of an hbm tier. 0 for any other pending fence. */
int tz_hbm_fence_waitable(tz_fence *f);

#endif
