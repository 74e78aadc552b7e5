"""Static checks of an ONNX graph against what a TensorRT release parses and fuses.

``trt_support`` holds the sourced support table (ops, opsets, dtypes per release);
``trt_attention`` what IAttention and the fused MHA kernels take; ``trt_compat`` runs
every check and returns a ``CompatReport``. Nothing here needs TensorRT or a GPU.
"""
