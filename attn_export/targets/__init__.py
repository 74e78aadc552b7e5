"""Targets as data, below the runtimes that read them: the TensorRT releases the toolkit's tables
cover (``trt_releases``) and what each GPU architecture runs (``gpu_arch``), each claim with its source.

Nothing here imports torch, onnx or TensorRT; ``runtime/``, ``checks/`` and ``export/`` read these
tables, and nothing here reads them back.
"""
