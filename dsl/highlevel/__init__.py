"""High-level IR: Python-like, with explicit tunables and SIMD/parallel loop kinds."""
