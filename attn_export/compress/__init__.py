"""attn_export.compress"""
