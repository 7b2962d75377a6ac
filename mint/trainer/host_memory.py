"""Giving freed host memory back to the operating system, in processes that train on the CPU.

glibc's malloc serves a large request from a fresh mapping only until the first such block is
freed; from then on it raises its mapping threshold (up to 32 MiB) and serves activation-sized
tensors from its heaps, which it keeps after they are freed. A training pass frees and allocates
thousands of tensors of changing sizes, so the heaps grow to several times what is alive at
once: SmolLM2-135M's forward_backward of 4 data x 800 tokens peaked at 8 GB of resident memory
over the loaded model with the dynamic threshold, and at 0.25 GB with a fixed one of 1 MiB (and
layer checkpointing, `packing.checkpointed_layers`), with the same loss and no slower.

`return_large_blocks` fixes the threshold (`mallopt`), so that every block of 1 MiB or more is a
mapping of its own, unmapped when freed. A process whose C library is not glibc keeps its own
policy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks at least this large are mapped on their own and returned to the system when freed.
MMAP_THRESHOLD_BYTES = 1 << 20
# Free memory at the top of a heap beyond this is returned to the system.
TRIM_THRESHOLD_BYTES = 16 << 20


def return_large_blocks() -> bool:
    """Make malloc map large blocks on their own and trim its heaps; True if it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
