"""What integrity on read costs: the loader with shard checks (``verify=True``: the index's digest,
xxh3-128 from index version 4, once per process and file state, every chunk present on every
read; ``verify="always"``: the digest on every read) against the same loader with
``verify=False`` (chunks counted only), epochs interleaved in one process (rotating order), median
of the per-epoch ratios. Also the decode alone (``WindowReader.read_window``), interleaved the
same way, and the CPU of the digest check of one window with each algorithm.

    python -m benchmarks.integrity_bench --cells 80000 --epochs 6 --data-dir bench_data

Noisy machines: only the interleaved ratios mean anything (both sides see the same background load).
First it prints the in-process speed of each digest algorithm (``--digest-mb`` of random bytes,
interleaved rounds, median): why builds write xxh3-128 (docs/FORMAT.md, "Digests").
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks import synth


def digest_speeds(mb: int, rounds: int = 5) -> dict[str, float]:
    """GB per CPU-second of one thread per algorithm (sha256, xxh3-128, and zlib's crc32 for scale:
    crc32c's package is not a dependency), rounds interleaved, median."""
    import hashlib
    import zlib

    import numpy as np
    import xxhash

    buf = np.random.default_rng(0).integers(0, 255, size=mb << 20, dtype=np.uint8).tobytes()
    algos = {
        "sha256": lambda: hashlib.sha256(buf).digest(),
        "xxh3_128": lambda: xxhash.xxh3_128(buf).digest(),
        "crc32 (zlib)": lambda: zlib.crc32(buf),
    }
    times: dict[str, list[float]] = {name: [] for name in algos}
    for _ in range(rounds):
        for name, fn in algos.items():
            t0 = time.thread_time()  # CPU, not wall: other jobs' load does not count
            fn()
            times[name].append(time.thread_time() - t0)
    return {name: len(buf) / statistics.median(t) / 1e9 for name, t in times.items()}


def window_digest_cpu(reader: object, window: int, rounds: int = 5) -> dict[str, float]:
    """CPU seconds (this thread) to check the digest of a window's shards as the loader does
    (``loaders.format.digests.matches`` over the files read), per algorithm, on the same bytes: what
    ``verify=True`` adds to a window's decode on its first read, with each index version's
    digest."""
    from loaders.format.digests import bytes_digest, matches
    from loaders.format.integrity import read_checked

    paths = reader.paths[:window]  # type: ignore[attr-defined]
    shards = [read_checked(Path(p), None) for p in paths]
    times: dict[str, list[float]] = {"sha256": [], "xxh3_128": []}
    for _ in range(rounds):
        for name, seconds in times.items():
            t0 = time.thread_time()
            for files in shards:
                matches(bytes_digest(b"", name), files.items())
            seconds.append(time.thread_time() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def build(cells: int, data_dir: Path, codec: str) -> Path:
    from pipeline.build import build as run_build

    ds = synth.ensure_dataset(synth.SynthParams(n_cells=cells), data_dir)
    out = data_dir / f"integrity-{cells}-{codec}"
    manifest = synth.write_manifest(
        data_dir / f"integrity-{cells}-{codec}.toml", ds, name="integrity", codec=codec
    )
    if not (out / "index.json").exists():
        run_build(manifest, out, jobs=1, progress=False)
    return out


def loader_epoch(dl: object, epoch: int) -> float:
    """cells/s of one epoch (time to first batch included, as in training)."""
    dl.set_epoch(epoch)  # type: ignore[attr-defined]
    t0, n = time.perf_counter(), 0
    for b in dl:  # type: ignore[attr-defined]
        n += b["X"].shape[0]
    return n / (time.perf_counter() - t0)


def decode_window(reader: object, pool: object, epoch: int) -> float:
    t0 = time.perf_counter()
    arena = reader.read_window(epoch, 0, pool)  # type: ignore[attr-defined]
    dt = time.perf_counter() - t0
    arena.release(pool)
    return dt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cells", type=int, default=80_000)
    ap.add_argument("--epochs", type=int, default=6, help="epochs per side (interleaved)")
    ap.add_argument("--codec", default="blosc-lz4")
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--digest-mb", type=int, default=256, help="bytes per digest speed round")
    args = ap.parse_args(argv)
    speeds = digest_speeds(args.digest_mb)
    speed = ", ".join(f"{k} {v:.1f} GB/s" for k, v in speeds.items())
    print(f"digest speed, one thread, per CPU-second: {speed}")

    from loaders import ShardDataset, ShardLoader
    from loaders.samples.arena import BufferPool

    root = build(args.cells, Path(args.data_dir), args.codec)
    kw = {"batch_size": 256, "window": args.window, "seed": 0}
    sides = {
        name: ShardLoader(ShardDataset(root, verify=v, **kw))  # type: ignore[arg-type]
        for name, v in (("on", True), ("always", "always"), ("off", False))
    }
    for dl in sides.values():
        loader_epoch(dl, 100)  # warm: page cache, decoder processes started
    rates: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for e in range(args.epochs):
        for name in names[e % 3 :] + names[: e % 3]:  # rotate who goes first
            rates[name].append(loader_epoch(sides[name], e))
    readers = {name: dl.dataset.reader for name, dl in sides.items()}
    pools = {name: BufferPool() for name in sides}
    decode: dict[str, list[float]] = {name: [] for name in sides}
    for e in range(2 * args.epochs):
        for name in names[e % 3 :] + names[: e % 3]:
            decode[name].append(decode_window(readers[name], pools[name], e))
    stored = sum(e.bytes for e in readers["on"].entries[: args.window]) / 1e6
    hashed = window_digest_cpu(readers["on"], args.window)
    print(
        f"data: {root} ({len(readers['on'].entries)} train shards, window {args.window}: ~{stored:.0f} MB stored "
        "per window)"
    )
    print(
        "digest of one window's stored bytes, CPU (thread time, median of 5 interleaved): "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in hashed.items())
        + f"; the window's decode (verify=off) {statistics.median(decode['off']):.3f} s"
    )
    for name in sides:
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["off"], strict=True))
        d_ratio = statistics.median(a / b for a, b in zip(decode[name], decode["off"], strict=True))
        print(
            f"verify={name:6}: loader median {statistics.median(rates[name]):9,.0f} cells/s, throughput / off "
            f"{ratio:.3f} (median of interleaved epochs); one window decoded in-process "
            f"{statistics.median(decode[name]):.3f} s, time / off {d_ratio:.3f}"
        )


if __name__ == "__main__":
    main()
