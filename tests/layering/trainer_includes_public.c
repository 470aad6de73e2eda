/* Trainer code including a public header of a layer below it: compiles (tests/layering), which
 * shows the failing builds beside it fail for their header and not for the way they are built. */
#include "core/tier.h"
#include "kernels/compute.h"
