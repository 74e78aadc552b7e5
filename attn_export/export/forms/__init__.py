"""Attention forms with a graph structure of their own (``long-seq``'s O(L)-memory loop).
"""
