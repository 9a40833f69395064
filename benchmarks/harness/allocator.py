"""The host allocator under a benchmark that runs many candidates in one process.

Note [Page faults are the heap's, not the candidate's]
glibc's malloc hands freed memory back to the kernel (it trims the top of the heap, and unmaps
blocks it had mapped on their own) and moves its thresholds with what was freed last. Which
candidate then faults its tensors' pages in again depends on the heap's history, which every
candidate in the process shares, not on its own work. Measured on the world-of-one CNN (batch
16, after 30 warm-up steps) in four processes: the plain optimizer faulted about
3,000, 4,100, 0 and 3,400 pages per step (the last in its update's temporaries), `dear`, in
three of them, about 3,800, 4,400 and 0. Two overhead runs of that CNN without this setting
put the control (a second plain optimizer) at 0.990x and 1.046x, and the overlap policies
anywhere from 1.05x to 1.19x; with it (set through glibc's environment variables), the control
was at 1.002x and no candidate faulted more than about 100 pages per step. So the benchmark
keeps freed memory in the heap: the table then measures the candidates' own work. Long-running
trainers get the same by preloading jemalloc or tcmalloc, as PyTorch's CPU performance guide
advises.
"""

from __future__ import annotations

import ctypes
import resource
import sys

# mallopt(3) parameters
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 32 << 20),  # the largest glibc accepts
             (_M_TRIM_THRESHOLD, 1 << 30),
             (_M_TOP_PAD, 64 << 20))


def keep_freed_memory() -> str | None:
    """Tells glibc's malloc to keep freed memory for reuse (Note [Page faults are the heap's,
    not the candidate's]); a line saying what was set, or None where the C library has no
    mallopt (not glibc) and nothing changed."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if not all(mallopt(option, value) == 1 for option, value in _SETTINGS):
        return None
    return ("glibc malloc keeps freed memory (mallopt: mmap threshold 32 MiB, trim threshold "
            "1 GiB, top pad 64 MiB)")


def page_faults() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
