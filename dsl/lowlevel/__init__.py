"""Low-level IR: a C-like kernel language, close to how CPU LLM kernels are written."""
