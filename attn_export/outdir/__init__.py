"""A run's output folder: claiming and locking it, recovering from a killed run, atomic writes and
file operations that never follow a planted link. Below every layer that writes files.
"""
