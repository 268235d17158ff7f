#!/usr/bin/env python3
"""Metadata benchmark: create / stat / delete N empty files with T workers, side by side on a
shoal mount and a local directory. Run it through tests/bench/metadata.sh (same arguments).

Each worker is a process (no GIL between them) with its own subdirectory and N/T files. A
phase starts on all workers at once (a barrier) and its time is from the first worker's start
to the last one's end; every single operation is timed too, for the latency percentiles.
  create   open(O_CREAT|O_EXCL|O_WRONLY, 0644) + close
  stat     stat
  delete   unlink
Standard library only. Exit status: 0 with the table on stdout, 1 on a failure, 2 on a usage
error.
"""

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import sys
import time

PHASES = ("create", "stat", "delete")


def worker(base, index, count, barrier, results, drop, one_dir):
    if one_dir:
        paths = [os.path.join(base, f"t{index}-f{j:07d}") for j in range(count)]
    else:
        sub = os.path.join(base, f"t{index}")
        paths = [os.path.join(sub, f"f{j:07d}") for j in range(count)]
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    clock = time.perf_counter_ns
    try:
        for phase in PHASES:
            lat = [0] * count
            barrier.wait()
            start = time.monotonic_ns()
            if phase == "create":
                for j, p in enumerate(paths):
                    t = clock()
                    os.close(os.open(p, flags, 0o644))
                    lat[j] = clock() - t
            elif phase == "stat":
                for j, p in enumerate(paths):
                    t = clock()
                    os.stat(p)
                    lat[j] = clock() - t
            else:
                for j, p in enumerate(paths):
                    t = clock()
                    os.unlink(p)
                    lat[j] = clock() - t
            end = time.monotonic_ns()
            results.put((index, phase, start, end, lat, None))
            barrier.wait()  # the parent may drop caches before the next phase
            if drop and phase != PHASES[-1]:
                barrier.wait()
    except Exception as e:  # reported by the parent; the barrier is broken for the others
        results.put((index, None, 0, 0, [], f"{type(e).__name__}: {e}"))
        barrier.abort()


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def percentile(sorted_values, q):
    # nearest rank
    if not sorted_values:
        return 0
    k = max(0, min(len(sorted_values) - 1, -(-len(sorted_values) * q // 100) - 1))
    return sorted_values[int(k)]


def next_result(results, procs):
    while True:
        try:
            return results.get(timeout=1)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a worker died (exit code {dead[0].exitcode})")


def run(directory, files, threads, drop, one_dir):
    base = os.path.join(directory, f"shoal-meta.{os.getpid()}")
    os.mkdir(base)
    counts = [files // threads + (1 if i < files % threads else 0) for i in range(threads)]
    for i in range(threads):
        if not one_dir:
            os.mkdir(os.path.join(base, f"t{i}"))
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(threads + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(base, i, counts[i], barrier, results, drop, one_dir))
        for i in range(threads)
    ]
    for p in procs:
        p.start()
    out, dropped = {}, True
    try:
        for phase in PHASES:
            barrier.wait()  # all start
            got = []
            for _ in range(threads):
                index, ph, start, end, lat, err = next_result(results, procs)
                if err:
                    raise RuntimeError(f"worker {index} in {directory}: {err}")
                got.append((start, end, lat))
            barrier.wait()  # all done
            if drop and phase != PHASES[-1]:
                dropped = drop_caches() and dropped
                barrier.wait()
            wall_ns = max(e for _, e, _ in got) - min(s for s, _, _ in got)
            lat = sorted(v for _, _, l in got for v in l)
            out[phase] = {
                "ops": len(lat),
                "seconds": wall_ns / 1e9,
                "ops_per_s": len(lat) / (wall_ns / 1e9) if wall_ns else float("inf"),
                "p50_us": percentile(lat, 50) / 1000,
                "p95_us": percentile(lat, 95) / 1000,
                "p99_us": percentile(lat, 99) / 1000,
                "max_us": (lat[-1] if lat else 0) / 1000,
            }
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        shutil.rmtree(base, ignore_errors=True)
    return out, dropped


def main():
    ap = argparse.ArgumentParser(
        prog="metadata.sh",
        description="create / stat / delete N files with T workers on a shoal mount and a "
        "local directory; prints a markdown table (ops/s, shoal/local, latency percentiles).",
    )
    ap.add_argument("mount_dir", metavar="MOUNT_DIR", help="a directory on the shoal mount")
    ap.add_argument("local_dir", metavar="LOCAL_DIR", help="a directory on a local filesystem")
    ap.add_argument("--files", type=int, default=10000, help="files in all (default 10000)")
    ap.add_argument("--threads", type=int, default=4,
                    help="workers, files split evenly (default 4)")
    ap.add_argument("--one-dir", action="store_true",
                    help="all workers in one directory instead of one subdirectory each")
    ap.add_argument("--drop-caches", action="store_true",
                    help="sync and drop the kernel caches between phases (root)")
    ap.add_argument("--out", default="/var/tmp/shoal-bench/metadata.json",
                    help="summary JSON (default %(default)s); the table also goes to .md beside it")
    a = ap.parse_args()
    if a.threads < 1 or a.files < a.threads:
        ap.error("need --threads >= 1 and --files >= --threads")
    if not a.out.endswith(".json"):
        ap.error("--out must name a .json file")
    for d in (a.mount_dir, a.local_dir):
        if not (os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)):
            ap.error(f"{d} is not a writable directory")

    results, dropped = {}, True
    for label, d in (("local", a.local_dir), ("shoal", a.mount_dir)):
        print(f"== {label}: {a.files} files, {a.threads} workers in {d}", file=sys.stderr)
        results[label], ok = run(d, a.files, a.threads, a.drop_caches, a.one_dir)
        dropped = dropped and ok

    us = lambda r: f"{r['p50_us']:,.0f} / {r['p95_us']:,.0f} / {r['p99_us']:,.0f}"
    rows = []
    for phase in PHASES:
        loc, sho = results["local"][phase], results["shoal"][phase]
        ratio = sho["ops_per_s"] / loc["ops_per_s"] if loc["ops_per_s"] else float("nan")
        rows.append(f"| {phase} | {loc['ops_per_s']:,.0f} | {sho['ops_per_s']:,.0f} | {ratio:.2f} "
                    f"| {us(loc)} | {us(sho)} |")
    caches = ("dropped between phases" + ("" if dropped else " (FAILED: not root?)")
              if a.drop_caches else "kept")
    table = "\n".join([
        f"metadata: {a.files} files, {a.threads} workers "
        f"({'one directory' if a.one_dir else 'one subdirectory each'}); caches {caches}",
        f"local = {a.local_dir}, shoal = {a.mount_dir}",
        "",
        "| phase | local ops/s | shoal ops/s | shoal/local | local p50 / p95 / p99 µs "
        "| shoal p50 / p95 / p99 µs |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
    ])
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"files": a.files, "threads": a.threads, "drop_caches": a.drop_caches,
                   "one_dir": a.one_dir,
                   "shoal_dir": a.mount_dir, "local_dir": a.local_dir, "results": results},
                  f, indent=2)
    with open(a.out[: -len(".json")] + ".md", "w") as f:
        f.write(table + "\n")
    print(table)
    print(f"metadata.sh: summary in {a.out}, table in {a.out[:-5]}.md", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except (OSError, RuntimeError) as e:  # BrokenBarrierError is a RuntimeError
        print(f"metadata.sh: {e}", file=sys.stderr)
        sys.exit(1)
