"""``attn-export fleet``: a matrix of models x recipes x targets, each point a ``RunConfig`` through the
one planner, run locally or placed on a Ray cluster by node labels, with a content-addressed cache.
"""
