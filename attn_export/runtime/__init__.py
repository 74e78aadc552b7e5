"""attn_export.runtime"""
