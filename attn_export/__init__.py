"""attn-export: compress, export, build and verify attention layers."""

__version__ = "0.1.0"

