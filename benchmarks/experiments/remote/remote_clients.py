"""Which S3 client the remote store uses: obstore vs s3fs vs boto3, measured (docs/REMOTE.md).

    .venv/bin/python benchmarks/experiments/remote/remote_clients.py [--objects 32] [--mb 8] [--rounds 5]

Needs the dev extra (boto3, moto[server]) plus ``pip install obstore s3fs``, the two contenders.

Starts moto_server on 127.0.0.1 (or uses ``AWS_ENDPOINT_URL`` if set), uploads OBJECTS objects of MB
MiB, then per round and per client (interleaved in one process, order rotated each round): GET all
sequentially, and with 8 concurrent requests (threads; s3fs: its own ``cat`` of the batch); prints
the median MB/s. Also: each client's import time (fresh interpreter, median of 3) and whether a
client created in a forked child works after the parent used that library (the DataLoader case:
the trainer opens the dataset, then forks workers). moto is in-process Python: on 127.0.0.1 it,
not the client, is the ceiling, so close GET numbers here mean "no client is the bottleneck",
not "equal against real S3".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

BUCKET = "bench"
CLIENTS = ("obstore", "s3fs", "boto3")


def make(name: str, endpoint: str):  # returns get(key) -> bytes and get_many(keys) -> None
    if name == "obstore":
        import obstore
        from obstore.store import S3Store

        s = S3Store(BUCKET, endpoint=endpoint, client_options={"allow_http": True})
        return (lambda k: bytes(obstore.get(s, k).bytes())), None
    if name == "s3fs":
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        return (lambda k: fs.cat_file(f"{BUCKET}/{k}")), (
            lambda ks: fs.cat([f"{BUCKET}/{k}" for k in ks], batch_size=8)
        )
    import boto3
    from botocore.config import Config

    c = boto3.client("s3", endpoint_url=endpoint, config=Config(max_pool_connections=16))
    return (lambda k: c.get_object(Bucket=BUCKET, Key=k)["Body"].read()), None


def rate(fn, keys, total_mb: float, concurrent: bool, many) -> float:
    t = time.perf_counter()
    if concurrent and many is not None:
        many(keys)
    elif concurrent:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(fn, keys))
    else:
        for k in keys:
            fn(k)
    return total_mb / (time.perf_counter() - t)


def import_s(name: str) -> float:
    code = f"import time; t = time.perf_counter(); import {name}; print(time.perf_counter() - t)"
    runs = [float(subprocess.check_output([sys.executable, "-c", code])) for _ in range(3)]
    return statistics.median(runs)


FORK = """
import os, signal, sys
sys.path.insert(0, {root!r})
from benchmarks.experiments.remote.remote_clients import make
get, _ = make({name!r}, {endpoint!r})
get("o0")  # the parent uses the library, then forks: a worker makes its own client
pid = os.fork()
if pid == 0:
    signal.alarm(15)
    g, _ = make({name!r}, {endpoint!r})
    os._exit(0 if len(g("o0")) > 0 else 1)
print(os.waitpid(pid, 0)[1])
"""


def fork_ok(name: str, endpoint: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = FORK.format(root=root, name=name, endpoint=endpoint)
    status = int(subprocess.check_output([sys.executable, "-c", code], timeout=60))
    return "works" if status == 0 else f"hangs (child killed after 15 s, status {status})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=32)
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_REGION", "us-east-1")
    server = None
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint is None:
        endpoint = "http://127.0.0.1:5632"
        exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
        server = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", "5632"], stderr=subprocess.DEVNULL)
        time.sleep(2)
    try:
        import boto3

        c = boto3.client("s3", endpoint_url=endpoint)
        c.create_bucket(Bucket=BUCKET)
        blob = os.urandom(a.mb << 20)
        keys = [f"o{i}" for i in range(a.objects)]
        for k in keys:
            c.put_object(Bucket=BUCKET, Key=k, Body=blob)
        total = a.objects * a.mb * 1.048576
        made = {n: make(n, endpoint) for n in CLIENTS}
        runs: dict[str, list[float]] = {f"{n} {m}": [] for n in CLIENTS for m in ("seq", "x8")}
        for r in range(a.rounds):
            order = CLIENTS[r % 3 :] + CLIENTS[: r % 3]
            for n in order:
                get, many = made[n]
                runs[f"{n} seq"].append(rate(get, keys, total, False, many))
                runs[f"{n} x8"].append(rate(get, keys, total, True, many))
        out = {
            "get_MBps_median": {k: round(statistics.median(v), 1) for k, v in runs.items()},
            "import_s": {n: round(import_s(n), 3) for n in CLIENTS},
            "client_after_fork": {n: fork_ok(n, endpoint) for n in CLIENTS},
            "setup": f"{a.objects} x {a.mb} MiB, {a.rounds} rounds, moto on {endpoint}",
        }
        print(json.dumps(out, indent=1))
    finally:
        if server is not None:
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
