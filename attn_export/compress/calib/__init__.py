"""Calibration data for static quantization: the shipped sets, user files, their bounds, generation
and the per-tensor choice of a calibration method.
"""
