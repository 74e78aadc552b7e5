"""One plan builds everything: ``make_plan`` makes every stage, the runner builds each once, times
them side by side and judges them, selection picks what ships, the deploy steps ship it.
"""
