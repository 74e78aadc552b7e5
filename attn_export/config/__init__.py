"""A run's options: ``RunConfig`` (validated before any heavy import), the cross-flag rules and the
optional packages a run needs. Above the subjects and the compressors it configures.
"""
