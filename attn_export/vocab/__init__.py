"""The shared words: the value lists every flag takes, the ``Precision`` objects and the
``RunOptions`` protocol. The bottom layer: it imports nothing of the package but the errors.
"""
