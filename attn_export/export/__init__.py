"""attn_export.export"""
