"""The machine and the process a run lives in: CPU detection and versions, threads, denormals and
OpenMP, signals, memory, path checks, quiet third-party loggers and lazy imports.
"""
