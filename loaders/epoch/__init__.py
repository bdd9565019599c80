"""The epoch's order, pure bookkeeping over ``index.json``'s unit counts: which units each batch of
each rank holds (``order``), their canonical partitions for resuming on another world
(``elastic``), batch budgets (``budget``), resume states (``resume``), and which window each batch
reads and which to decode next (``schedule``, ``layout``). Torch-free, numpy only."""
