"""Compiling a run for a TPU slice or a GPU host without its chips, and what the compiled program costs."""
