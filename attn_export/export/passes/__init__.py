"""Graph passes applied after ``torch.onnx`` export: typed constants, 2-D GEMMs, row-wise
LayerNorm and the mask-free packed attention.
"""
