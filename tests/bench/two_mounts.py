#!/usr/bin/env python3
"""Two nodes creating files: one worker on each of two mounts of the same namespace, creating
N empty files each (open(O_CREAT|O_EXCL) + close), at once, first both in one directory, then
each in a directory of its own; one mount alone as the reference. Prints a markdown table of
creates per second and writes the summary as JSON.

    tests/bench/two_mounts.py [--files N] [--out FILE.json] MOUNT_A MOUNT_B

MOUNT_A and MOUNT_B are two nodes' mounts of one cluster (the same namespace). Standard library
only. Exit status: 0 with the table on stdout, 1 on a failure, 2 on a usage error.
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import time


def creator(directory, prefix, count, barrier, results):
    barrier.wait()
    start = time.monotonic()
    for i in range(count):
        fd = os.open(os.path.join(directory, f"{prefix}{i:07d}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
    results.put((prefix, start, time.monotonic()))


def run(jobs):
    """jobs: (directory, prefix, count); all start together; returns creates per second."""
    barrier = mp.Barrier(len(jobs))
    results = mp.Queue()
    procs = [mp.Process(target=creator, args=(d, p, n, barrier, results)) for d, p, n in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"two_mounts.py: a worker failed (exit {p.exitcode})")
    times = [results.get() for _ in jobs]
    elapsed = max(t[2] for t in times) - min(t[1] for t in times)
    return sum(n for _, _, n in jobs) / elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000, help="files per mount (default 1000)")
    ap.add_argument("--out", default="/var/tmp/shoal-bench/two-mounts.json")
    ap.add_argument("mount_a")
    ap.add_argument("mount_b")
    args = ap.parse_args()
    base_a = os.path.join(args.mount_a, "two-mounts")
    base_b = os.path.join(args.mount_b, "two-mounts")
    shutil.rmtree(base_a, ignore_errors=True)
    for d in ("alone", "shared", "own-a", "own-b"):
        os.makedirs(os.path.join(base_a, d))
    # The other mount must see the directories its worker creates in (close-to-open).
    for d in ("shared", "own-b"):
        if not os.path.isdir(os.path.join(base_b, d)):
            sys.exit(f"two_mounts.py: {base_b}/{d} is not seen through the second mount")
    n = args.files
    rows = {
        "one mount alone": run([(os.path.join(base_a, "alone"), "a", n)]),
        "two mounts, one directory": run(
            [(os.path.join(base_a, "shared"), "a", n), (os.path.join(base_b, "shared"), "b", n)]),
        "two mounts, a directory each": run(
            [(os.path.join(base_a, "own-a"), "a", n), (os.path.join(base_b, "own-b"), "b", n)]),
    }
    for d in ("shared", "own-a", "own-b", "alone"):
        expected = {"shared": 2 * n}.get(d, n)
        found = len(os.listdir(os.path.join(base_a, d)))
        if found != expected:
            sys.exit(f"two_mounts.py: {d} holds {found} files, not {expected}")
    shutil.rmtree(base_a)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"files_per_mount": n, "creates_per_s": rows}, f, indent=2)
    print(f"two mounts: {n} empty files created per mount, creates per second (all mounts together)")
    print()
    print("| case | creates/s |")
    print("|---|---:|")
    for label, rate in rows.items():
        print(f"| {label} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
