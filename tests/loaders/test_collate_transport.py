"""Collated cells through every transport: main-process tensors, a worker's fresh shared segment
and a reused ring slot, against the dense matrix they came from (signed values, empty rows)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch


@pytest.mark.parametrize("output", ["dense", "csr", "sparse", "parts"])
def test_collate_round_trips_signed_values_and_empty_rows(output: str) -> None:
    from loaders.engine.device import assemble
    from loaders.engine.transport import Arena, BufferPool, Payload, Rows
    from loaders.format import FieldSpec

    rng = np.random.default_rng(0)
    m, g = 37, 101
    dense = np.where(rng.random((m, g)) < 0.2, rng.standard_normal((m, g)), 0).astype(np.float32)
    dense[3], dense[5] = 0, -1.5  # an empty row, a full negative row
    rows, cols = np.nonzero(dense)
    indptr = np.zeros(m + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    # two "shards" (the same rows), back to back, gathered in a shuffled order
    spec = FieldSpec("X", "csr", "float32", (g,))
    arena = Arena.allocate(
        [0, 1], [m, m], {"X/indptr": [rows.size, rows.size]}, [spec], BufferPool()
    )
    for i, off in enumerate(arena.entry_offsets["X/indptr"][:2]):
        arena.columns["X/indices"][off : off + rows.size] = cols
        arena.columns["X/data"][off : off + rows.size] = dense[rows, cols]
        arena.set_pointers(i, "X/indptr", indptr)
    arena.seal()
    order = rng.permutation(2 * m)
    payload = Payload(
        arrays={"sample_id": np.arange(2 * m, dtype=np.int64)},
        xs={"X": Rows([arena], None, order).csr("X", (2 * m, g))},
    )
    want = np.concatenate([dense, dense])[order]
    for batch in transported(payload, output):
        got = assemble(batch, "dense" if output == "parts" else output)
        if output == "csr":
            crow, cols, vals = (got[f"X.{n}"].numpy() for n in ("crow", "cols", "vals"))
            x = torch.from_numpy(
                sp.csr_matrix((vals, cols, crow), shape=(crow.size - 1, g)).toarray()
            )
        else:
            x = got["X"]
        np.testing.assert_array_equal((x.to_dense() if output == "sparse" else x).numpy(), want)
        np.testing.assert_array_equal(batch["sample_id"].numpy(), np.arange(2 * m))


def transported(payload: Any, output: str) -> list[dict[str, Any]]:
    """One payload through every transport: main-process tensors, a worker's fresh shared segment,
    and a worker's ring slot that held an earlier item's bytes (0x7F everywhere: finishers must not
    assume zeros), shipped as the second batch of a run of two."""
    from loaders.engine.device import unpack_batches
    from loaders.engine.ring import Ring
    from loaders.engine.transport import to_shared, to_tensors

    ring = Ring(1, max_bytes=64 << 20)
    stale = to_shared([payload, payload], output, ring)
    assert stale.slot is not None
    stale.buffer.numpy()[:] = 0x7F
    ring.control[stale.slot[1]] = 0  # the consumer let it go
    del stale
    item = to_shared([payload, payload], output, ring)
    assert item.slot is not None, "the ring must have served this item"
    return [
        to_tensors(payload, output),
        unpack_batches(to_shared([payload], output))[0],
        unpack_batches(item)[1],
    ]
