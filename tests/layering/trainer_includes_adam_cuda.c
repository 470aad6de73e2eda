/* Trainer code including a backend's header (the CUDA Adam's): must not compile
 * (tests/layering); the trainer reaches backends through the ops tables only. */
#include "kernels/cuda/adam_cuda.h"
