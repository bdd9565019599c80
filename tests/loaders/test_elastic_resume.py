"""Elastic resume through ShardLoader (simulated ranks in one process): an epoch started on 4 ranks
continues on 3, then on 2, with 0, 2 and 1 DataLoader workers, the global batch unchanged; every
unit of the epoch is served, repeats fewer than one global batch, and the next epoch is the
ordinary one of the new world. Cells, pairs, sentences, spike clips and CT volumes by voxel
budget (whose per-rank count changes with the world)."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaders import ShardDataset, ShardLoader
from loaders.format import read_index
from pipeline.build import build
from pipeline.modalities.spike.demo import write_spike_demo
from tests import hostile

G = 12  # the global batch: 4 x 3, 3 x 4, 2 x 6
CHAIN = ((4, 0, 3), (3, 2, 4), (2, 1, None))  # (world, workers, steps; None: to the end)
Batch = dict[str, torch.Tensor]


def unit_keys(sample: str) -> Callable[[Batch], list[Any]]:
    """What identifies a unit in a batch of ``sample``."""
    if sample == "pairs":
        return lambda b: list(zip(b["pert_id"].tolist(), b["ctrl_id"].tolist(), strict=True))
    if sample == "sentences":
        return lambda b: [tuple(row) for row in b["pert_id"].tolist()]
    return lambda b: [tuple(x) if isinstance(x, list) else x for x in b["sample_id"].tolist()]


def run_chain(
    make: Callable[..., ShardDataset],
    key: Callable[[Batch], list[Any]],
    chain: tuple[tuple[int, int, int | None], ...] = CHAIN,
    per_rank: Callable[[int], dict[str, Any]] = lambda world: {"batch_size": G // world},
) -> tuple[list[Any], dict[str, Any], list[int]]:
    """Every unit served by the chain's ranks, rank 0's last state, and each stage's len()."""
    served: list[Any] = []
    state: dict[str, Any] | None = None
    lengths = []
    for world, workers, steps in chain:
        states = []
        for rank in range(world):
            ds = make(rank=rank, world_size=world, **per_rank(world))
            dl = ShardLoader(ds, num_workers=workers, timeout=60)
            if state is not None:
                dl.load_state_dict(state)  # rank 0's state, on every rank of the new world
            if rank == 0:
                lengths.append(len(dl))
            taken = 0
            for batch in dl:
                served += key(batch)
                taken += 1
                if taken == steps:
                    break
            states.append(dl.state_dict())
        assert len({s["batches_done"] for s in states}) == 1  # the ranks stayed in step
        state = states[0]
    assert state is not None
    return served, state, lengths


def check_served(served: list[Any], reference: list[Any], exact: bool, global_batch: int) -> None:
    """Every unit of the reference epoch (as a multiset), repeats fewer than one global batch."""
    extra = Counter(served) - Counter(reference)
    assert not Counter(reference) - Counter(served), "units not served"
    assert sum(extra.values()) == len(served) - len(reference) < global_batch
    if exact:
        assert sorted(served, key=repr) == sorted(reference, key=repr)


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("elastic"),
        "shards",
        n_shards=5,
        cells=41,
        genes=12,
        seed=4,
        splits=("train", "train", "val"),
    )


@pytest.mark.process
@pytest.mark.parametrize("sample", ["cells", "pairs", "sentences"])
@hostile.parametrize
def test_cells_pairs_sentences_resume_on_4_3_2_ranks(
    case: hostile.Case, fx: Any, sample: str
) -> None:
    def make(**kw: Any) -> ShardDataset:
        return ShardDataset(fx.root, sample=sample, window=2, seed=5, decode_process=False, **kw)

    key = unit_keys(sample)
    reference = [u for b in make(batch_size=G) for u in key(b)]  # one rank: the epoch, once
    served, state, lengths = run_chain(make, key)
    assert len(set(lengths)) == 1  # fixed-size batches: the same step count on every world
    assert state["batches_done"] == lengths[0] and state["partitions"] == 4
    check_served(served, reference, len(reference) % G == 0, G)
    # the next epoch on 2 ranks is the ordinary 2-rank epoch
    for rank in range(2):
        dl = ShardLoader(make(rank=rank, world_size=2, batch_size=G // 2))
        dl.load_state_dict(state)
        dl.set_epoch(1)
        fresh = ShardLoader(make(rank=rank, world_size=2, batch_size=G // 2))
        fresh.set_epoch(1)
        assert [key(b) for b in dl] == [key(b) for b in fresh]
        assert dl.state_dict()["partitions"] == 2


@pytest.mark.process
@hostile.parametrize
def test_an_epoch_that_divides_evenly_is_served_exactly_once(
    case: hostile.Case, build_dataset: Callable[..., Any], tmp_path: Path
) -> None:
    even = build_dataset(tmp_path, "shards", n_shards=3, cells=48, genes=12, seed=6)

    def make(**kw: Any) -> ShardDataset:
        return ShardDataset(even.root, window=2, seed=1, decode_process=False, **kw)

    key = unit_keys("cells")
    reference = [u for b in make(batch_size=G) for u in key(b)]
    assert len(reference) == 144
    served, _, _ = run_chain(make, key)
    check_served(served, reference, True, G)


@hostile.parametrize
def test_refusals_stay(case: hostile.Case, fx: Any) -> None:
    state = ShardLoader(ShardDataset(fx.root, rank=0, world_size=4, batch_size=3)).state_dict()
    with pytest.raises(ValueError, match="global batch of 12"):
        ShardLoader(ShardDataset(fx.root, rank=0, world_size=3, batch_size=3)).load_state_dict(
            state
        )
    with pytest.raises(ValueError, match="seed"):
        ShardLoader(
            ShardDataset(fx.root, rank=0, world_size=3, batch_size=4, seed=9)
        ).load_state_dict(state)
    with pytest.raises(ValueError, match="another dataset"):  # the split's fingerprint
        ShardLoader(
            ShardDataset(fx.root, split="val", rank=0, world_size=2, batch_size=6)
        ).load_state_dict(state)
    with pytest.raises(ValueError, match="partitions=5"):
        ShardLoader(ShardDataset(fx.root, batch_size=12), partitions=5)
    ShardLoader(ShardDataset(fx.root, rank=2, world_size=3, batch_size=4)).load_state_dict(state)


def test_partitions_option_and_locality(fx: Any) -> None:
    """partitions=K on fewer ranks: a rank of M (M divides K) reads only its K/M partitions, so its
    units are those its partitions' ranks would have served."""

    def make(**kw: Any) -> ShardDataset:
        return ShardDataset(fx.root, window=2, seed=3, decode_process=False, **kw)

    key = unit_keys("cells")
    four = [
        [u for b in ShardLoader(make(rank=r, world_size=4, batch_size=3)) for u in key(b)]
        for r in range(4)
    ]
    for rank in range(2):
        dl = ShardLoader(make(rank=rank, world_size=2, batch_size=6), partitions=4)
        got = [u for b in dl for u in key(b)]
        assert sorted(got) == sorted(four[2 * rank] + four[2 * rank + 1])
        assert dl.state_dict()["partitions"] == 4


@pytest.mark.process
def test_spike_clips_resume_on_other_worlds(spike_built: Path) -> None:
    def make(**kw: Any) -> ShardDataset:
        return ShardDataset(
            spike_built,
            split="train",
            sample="spike",
            crop=(16, 16),
            seed=2,
            decode_process=False,
            **kw,
        )

    key = unit_keys("spike")
    reference = [u for b in make(batch_size=2) for u in key(b)]
    chain = ((2, 0, 2), (1, 2, 2), (2, 1, None))
    served, _, _ = run_chain(make, key, chain, lambda world: {"batch_size": 2 // world})
    check_served(served, reference, len(reference) % 2 == 0, 2)


@pytest.mark.process
def test_ct_budget_batches_resume_on_4_3_2_ranks(ct_budget: tuple[Path, int]) -> None:
    """Budget batches: the canonical batches not yet served are dealt round-robin to the new
    world's ranks, so the per-rank count changes with the world; every volume is served, each
    batch within the budget, repeats at most world - 1 whole batches."""
    root, cap = ct_budget

    def make(**kw: Any) -> ShardDataset:
        kw.pop("batch_size")
        return ShardDataset(
            root, sample="ct", max_points_per_batch=cap, seed=1, decode_process=False, **kw
        )

    key = unit_keys("ct")
    reference = [u for b in make(batch_size=1) for u in key(b)]
    sizes: list[int] = []

    def capped(b: Batch) -> list[Any]:
        assert b["coords"].shape[0] <= cap
        sizes.append(len(key(b)))
        return key(b)

    chain = ((4, 0, 1), (3, 2, 1), (2, 1, None))
    served, state, lengths = run_chain(make, capped, chain)
    t = lengths[0]  # per rank on 4; the plan has 4t canonical batches, 4 then 3 of them served
    # steps keep their numbers: len() = the steps done before + the rest dealt to this world
    assert lengths == [t, 1 + -(-(4 * t - 4) // 3), 2 + -(-(4 * t - 7) // 2)]
    assert state["offset"] == 7 and state["offset_step"] == 2
    assert not Counter(reference) - Counter(served)
    assert len(served) - len(reference) <= 3 * max(sizes)  # fewer than `world` whole batches
    assert state["partitions"] == 4


def test_ct_budget_resume_on_the_same_world_is_exact(ct_budget: tuple[Path, int]) -> None:
    """A budget state loaded on its own world size (after a resume on another one) yields exactly
    the batches the uninterrupted run would have: the layout is kept, not re-dealt."""
    root, cap = ct_budget

    def loader(rank: int, world: int) -> ShardLoader:
        return ShardLoader(
            ShardDataset(
                root,
                sample="ct",
                max_points_per_batch=cap,
                seed=1,
                rank=rank,
                world_size=world,
                decode_process=False,
            )
        )

    first = loader(0, 4)
    next(iter(first))
    state = loader(0, 3)
    state.load_state_dict(first.state_dict())  # 4 -> 3 ranks: re-dealt from step 1 on
    for rank in range(3):  # (the rest does not divide by 3: the last step wraps)
        full = loader(rank, 3)
        full.load_state_dict(state.state_dict())
        want = [b["sample_id"].tolist() for b in full]
        it = loader(rank, 3)
        it.load_state_dict(state.state_dict())
        got = [next(iter(it))["sample_id"].tolist()]
        again = loader(rank, 3)
        again.load_state_dict(it.state_dict())  # same world: the same layout, one step later
        got += [b["sample_id"].tolist() for b in again]
        assert got == want


@pytest.fixture(scope="module")
def spike_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("elastic-spike")
    write_spike_demo(root / "data" / "demo")
    (root / "m").mkdir()
    manifest = Path(__file__).resolve().parents[2] / "data_manifests" / "demo_spike.toml"
    shutil.copy(manifest, root / "m" / "demo_spike.toml")
    build(root / "m" / "demo_spike.toml", root / "out", jobs=2, progress=False)
    return root / "out"


@pytest.fixture(scope="module")
def ct_budget(tmp_path_factory: pytest.TempPathFactory, ct_npy: Any) -> tuple[Path, int]:
    """16 small volumes of 40-300 lung points, several shards; a budget of ~3 volumes."""
    root = tmp_path_factory.mktemp("elastic-ct")
    (root / "vols").mkdir()
    rng = np.random.default_rng(0)
    for i in range(16):
        vol = np.full((16, 16, 8), -1000, np.int16)
        vol[1:15, 1:15, :] = 40
        lung = rng.random((12, 12, 6)) < (0.05 + 0.3 * i / 16)
        vol[2:14, 2:14, 1:7][lung] = -850
        np.save(root / "vols" / f"v{i:02d}.npy", vol)
    out = ct_npy.make(root, "zarr", extra="min_points = 10", jobs=1)
    recs = read_index(out).section("ct")["records"].values()
    points = [r["points"] for rs in recs for r in rs]
    return out, max(points) * 2
