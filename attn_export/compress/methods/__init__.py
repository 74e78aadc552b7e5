"""One module per compression method: its self-describing config and the function that applies it.

``compress.registry.METHOD_MODULES`` lists them; importing one registers it.
"""
