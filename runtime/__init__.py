"""sandwich.runtime: kernel cache, loader, executor, serving."""

from sandwich.runtime.kernel_cache import GemmKernel, KernelCache, PackedWeight

__all__ = ["GemmKernel", "KernelCache", "PackedWeight"]
