"""Linux gives a process AMX's tile state (8 KiB a thread) only when it asks for it: before
that, the first tile instruction kills the process with SIGILL. Asked once per process,
before a kernel with tile statements runs."""

from __future__ import annotations

import ctypes
import os
import platform
from functools import lru_cache

from sandwich.errors import ToolError

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@lru_cache(maxsize=1)
def request_tiles() -> None:
    """Ask Linux for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA); ToolError
    in one line where it is refused: no AMX on the CPU, or a kernel older than 5.16."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise ToolError(f"AMX tiles need Linux on x86_64, not {platform.system()} on "
                        f"{platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        reason = os.strerror(ctypes.get_errno())
        raise ToolError(f"Linux refused this process the AMX tile state ({reason}): the CPU "
                        "has no AMX, or the kernel is older than 5.16")
