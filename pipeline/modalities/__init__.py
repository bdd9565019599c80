"""The built-in modalities, build side: one folder each (sources, kind, planner pieces, demo
writer).

Found through each read-side module's ``BUILD_MODULE`` (:mod:`loaders.plugins`), like a third-party
one.
"""
