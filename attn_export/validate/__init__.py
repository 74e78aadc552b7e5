"""attn_export.validate"""
