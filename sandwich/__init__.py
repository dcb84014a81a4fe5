"""sandwichc: an autotuning compiler and CPU serving runtime for LLMs (the Sandwich design)."""

__version__ = "0.1.0"
