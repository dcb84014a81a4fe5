"""sandwichc: an autotuning compiler and CPU serving runtime for LLMs (the Sandwich design)."""

import os

__version__ = "0.1.0"

# TVM sizes its thread pool from TVM_NUM_THREADS, and without it asks glibc for the online
# CPUs on every parallel launch: glibc reads /sys/devices/system/cpu/online each time, which
# cost 8 us a 2-thread launch on a 2-core Zen 3 VM (1.6-2.8 us with it set), and the pool it
# then sizes is half the CPUs on x86. The CLI sets it from --threads; a process that imports the
# package (a notebook, an RPC server loading sandwich.compiler.rpc) gets every CPU it may use.
os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
