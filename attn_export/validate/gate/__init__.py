"""The accuracy gate (``attn-export check``): baselines with their per-precision slack, the hashes
that tie a report to its run, the comparison and its result.
"""
