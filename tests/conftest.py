"""Shared test setup: TVM's thread pool is sized from TVM_NUM_THREADS when it starts."""

import os

os.environ.setdefault("TVM_NUM_THREADS", "2")
