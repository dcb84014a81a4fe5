"""Linux futex wait/wake on a 32-bit word of shared memory, through ctypes.

A rank that waits at the all-reduce barrier sleeps in the kernel until its peer's counter
changes, instead of spinning: when two ranks share a core (a busy machine), spinning or
sleep-polling costs a scheduler tick per barrier, a futex wake costs a context switch.
"""

from __future__ import annotations

import ctypes
import platform
import sys

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
FUTEX_WAIT, FUTEX_WAKE = 0, 1  # not FUTEX_PRIVATE_FLAG: the word is shared between processes
AVAILABLE = sys.platform.startswith("linux") and _SYS_FUTEX is not None
_libc = ctypes.CDLL(None, use_errno=True) if AVAILABLE else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def wait(addr: int, expected: int, timeout_s: float) -> None:
    """Sleep while the uint32 at addr equals `expected`, at most timeout_s (spurious returns
    are fine: the caller re-checks)."""
    ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
    _libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_long(FUTEX_WAIT),
                  ctypes.c_long(expected & 0xFFFFFFFF), ctypes.byref(ts), None, ctypes.c_long(0))


def wake(addr: int) -> None:
    """Wake every process sleeping on the word at addr."""
    _libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_long(FUTEX_WAKE),
                  ctypes.c_long(2**31 - 1), None, None, ctypes.c_long(0))
