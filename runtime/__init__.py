"""sandwich.runtime: checkpoints, loader, KV cache, executor, engine, tensor parallelism.
Re-exports the kernel cache it runs from (the tuner fills it), as the README shows."""

from sandwich.tuner.kernel_cache import GemmKernel, KernelCache, PackedWeight

__all__ = ["GemmKernel", "KernelCache", "PackedWeight"]
