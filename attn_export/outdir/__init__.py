"""The output folder a run owns: its manifest (``manifest``); claiming and recovery join it with the folder move."""
