#!/usr/bin/env python3
"""Reads `shoal status --json` answers for ansible/tests/run.sh.

  lab_status.py all-alive OBSERVER N < status.json
      exit 0 iff the answer comes from nodeOBSERVER and lists exactly node1..nodeN, all alive
  lab_status.py generation < status.json
      print the answering agent's generation
  lab_status.py windows < lines "nodeI STOPPING STARTED" (epoch seconds, from each journal)
      exit 0 iff every node has a restart window and the windows, in node order, do not
      overlap: each agent was back before the next one was stopped
  lab_status.py best-effort OBSERVER MEMORY_BYTES CORES < status.json
      exit 0 iff the answer comes from nodeOBSERVER and shows its reservation (the given
      memory limit and reserved cores) NOT enforced, with a note saying why; prints the note
  lab_status.py rolling POLL_LOG N
      POLL_LOG has lines "EPOCH nodeI JSON-or-none", N per polling round. For each round, the
      nodes that were out: not answering, or listed in another state than alive by a node that
      answered.
      Exit 0 iff no round had more than one node out (and there was at least one round).

A restarted agent keeps its id and gets a higher generation; for a moment the others may
list both incarnations, so only the newest generation of each name counts.
"""

import json
import sys


def latest(status):
    """Newest entry of every member name."""
    newest = {}
    for m in status["nodes"]:
        if m["name"] not in newest or m["generation"] > newest[m["name"]]["generation"]:
            newest[m["name"]] = m
    return newest


def all_alive(observer, n):
    status = json.load(sys.stdin)
    want = {f"node{j}" for j in range(1, n + 1)}
    members = latest(status)
    alive = {k for k, m in members.items() if m["state"] == "alive"}
    selves = [m["name"] for m in status["nodes"] if m["is_self"]]
    return alive == want and set(members) == want and selves == [f"node{observer}"]


def generation():
    status = json.load(sys.stdin)
    print([m["generation"] for m in status["nodes"] if m["is_self"]][0])
    return True


def best_effort(observer, memory_bytes, cores):
    status = json.load(sys.stdin)
    selves = [m["name"] for m in status["nodes"] if m["is_self"]]
    r = status.get("resources")
    if selves != [f"node{observer}"] or r is None:
        print(f"    node{observer}: answered by {selves}, resources {r}")
        return False
    print(f"    node{observer}: enforced={r['enforced']} memory_limit_bytes={r['memory_limit_bytes']} "
          f"reserved_cores={r['reserved_cores']} note: {r.get('note')}")
    return (r["enforced"] is False and bool((r.get("note") or "").strip())
            and r["memory_limit_bytes"] == memory_bytes and r["reserved_cores"] == cores
            and r.get("cpus") is None)


def windows():
    rows = [line.split() for line in sys.stdin.read().splitlines() if line.strip()]
    good = len(rows) > 0
    for row in rows:
        if len(row) != 3:
            print(f"    {row[0]}: no restart in its journal")
            good = False
    if not good:
        return False
    t0 = float(rows[0][1])
    print("    restart windows (s): " + ", ".join(
        f"{name} {float(a) - t0:.2f}-{float(b) - t0:.2f}" for name, a, b in rows))
    return all(float(rows[k][2]) < float(rows[k + 1][1]) for k in range(len(rows) - 1))


def rolling(path, n):
    lines = [line.split(" ", 2) for line in open(path).read().splitlines() if line.count(" ") >= 2]
    rounds = [lines[k:k + n] for k in range(0, len(lines) - n + 1, n)]
    worst, ever_out = 0, set()
    for r in rounds:
        out = set()
        for _, observer, answer in r:
            if answer.strip() == "none":
                out.add(observer)
                continue
            # A member missing from a view is not counted: an agent that has just restarted
            # lists only the members it has heard from so far.
            members = latest(json.loads(answer))
            out |= {k for k, m in members.items() if m["state"] != "alive"}
        ever_out |= out
        worst = max(worst, len(out))
    print(f"    {len(rounds)} polling rounds; at most {worst} node(s) out at once; "
          f"out at some point: {' '.join(sorted(ever_out)) or 'none'}")
    return worst <= 1 and len(rounds) > 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "all-alive":
        good = all_alive(sys.argv[2], int(sys.argv[3]))
    elif cmd == "generation":
        good = generation()
    elif cmd == "best-effort":
        good = best_effort(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "windows":
        good = windows()
    elif cmd == "rolling":
        good = rolling(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(f"unknown command {cmd}")
    sys.exit(0 if good else 1)
