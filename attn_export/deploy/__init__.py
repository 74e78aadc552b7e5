"""Deployment artifacts: the Jetson bundle, the Triton model repository, the on-device validator.

``steps`` holds the plan's deploy steps (static TensorRT check, bundle, Triton repository);
``on_device_validator.py`` is copied into every bundle and runs on the device without
attn-export installed.
"""
