/* Trainer code including core's private header: must not compile (tests/layering). */
#include "core/internal.h"
