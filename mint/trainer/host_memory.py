"""Host memory of large training passes on the CPU: freed blocks go back to the system. Also
how a process reads its resident memory and its peak (`resident_peak_bytes`), by which a worker
group's sharded loading is measured.

glibc's malloc serves a large request from a mapping of its own only until the first such block
is freed; then it raises its mapping threshold (up to 32 MiB) and serves activation-sized tensors
from its heaps, which keep what is freed. Reusing heap pages is fast (no page faults), and a
pass's peak then holds about twice its live tensors. Measured on SmolLM2-135M, 4 data x 800
tokens, every activation kept, in a fresh process: 8.4 GB over the loaded model at 12 s with the
dynamic threshold, 3.7 GB at 18 s with a fixed one of 1 MiB (`bench/pass_memory.py` compares
the ordinary pass with the large one, which adds layer checkpointing).

So a process keeps glibc's fast behaviour for ordinary passes, and `returning_large_blocks`
switches to the fixed threshold for the duration of a large pass (with layer checkpointing,
`packing.checkpointed_layers`): it first gives back what the heaps hold (`malloc_trim`), then maps
every block of 1 MiB or more on its own, and afterwards sets the threshold to glibc's ceiling
(32 MiB, where the dynamic threshold ends up) and trims again. Setting the threshold also stops
glibc from adjusting its trim threshold, which would stay at 128 KiB: the heap would then be cut
back after every pass and its pages faulted in again by the next (measured: the output head's
fills ran at 0.6 GB/s, a mixed pass of two sessions 30% slower than after a fresh start). So the
trim threshold is set where the dynamic one ends up too, twice the mapping threshold. Where the
C library is not glibc, nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# Blocks at least this large are mapped on their own during a large pass, unmapped when freed.
LARGE_PASS_MMAP_THRESHOLD = 1 << 20
# Outside large passes: glibc's ceiling for its dynamic threshold, and the trim threshold that
# goes with it.
ORDINARY_MMAP_THRESHOLD = 32 << 20
ORDINARY_TRIM_THRESHOLD = 2 * ORDINARY_MMAP_THRESHOLD


@functools.cache
def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl has neither)
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def can_return_memory() -> bool:
    """Whether this process's malloc takes these settings (glibc)."""
    return _glibc() is not None


@contextmanager
def returning_large_blocks() -> Iterator[None]:
    """While open, blocks of 1 MiB or more are mapped on their own and unmapped when freed."""
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.malloc_trim(0)
    libc.mallopt(M_MMAP_THRESHOLD, LARGE_PASS_MMAP_THRESHOLD)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, ORDINARY_MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, ORDINARY_TRIM_THRESHOLD)
        libc.malloc_trim(0)


def share_one_arena() -> None:
    """From now on, threads that first allocate use the main heap, not an arena of their own.

    glibc gives each thread that allocates its own arena (up to eight per core), and memory
    freed in one arena serves only that arena's threads. Several sessions' training loops on one
    base are threads whose passes each run on whichever thread leads them, so every arena grew
    to hold a whole pass: 4 RL jobs at once on SmolLM2 peaked at 6.9 GB, against 5.1 GB when the
    ResidentBase calls this (torch's own threads already have arenas by then) and 3.5 GB with
    `MALLOC_ARENA_MAX=1` from the process's start; 0.86x against 0.92x the throughput of the
    same jobs one after another (`bench/rl_throughput.py`). A worker calls it first thing. The
    passes run one at a time under the base's lock, so the threads seldom contend for the heap.
    Where the C library is not glibc, nothing changes.
    """
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, 1)


# ---- measuring --------------------------------------------------------------------------------


def resident_bytes() -> int:
    """This process's resident memory now (Linux's VmRSS; 0 where there is no /proc)."""
    return _status_bytes("VmRSS")


def resident_peak_bytes() -> int:
    """This process's peak resident memory since it started or since `reset_resident_peak`
    (Linux's VmHWM; 0 where there is no /proc)."""
    return _status_bytes("VmHWM")


def reset_resident_peak() -> bool:
    """Start `resident_peak_bytes` again from the current resident memory (Linux's clear_refs);
    False where the kernel does not allow it, and the peak then still counts from the start."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def _status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return 0
