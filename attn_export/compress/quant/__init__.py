"""8-bit quantization of a graph or module: Q/DQ placement, SmoothQuant, FP8, int8 encodings for
ONNX Runtime CPU, mixed precision and the eager int8 path.
"""
