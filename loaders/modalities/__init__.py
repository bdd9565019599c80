"""The built-in modalities, read side: one folder each (sample types, numpy ops, torch finishers,
codecs).

Nothing here imports them: each is found through the ``shardsmith.modalities`` entry points
(:mod:`loaders.plugins`), exactly like a third-party modality.
"""
