"""Many runs as one: ``sweep`` (recipes over one model) and ``bench`` (variants over a shape grid),
each a list of ``RunConfig`` that goes through the one planner.
"""
