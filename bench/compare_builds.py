#!/usr/bin/env python3
"""Two builds of `lance-context` side by side on the same workload, in one run.

    python3 bench/compare_builds.py --before OLD/lance-context --after NEW/lance-context

What it runs, alternating the two builds (which goes first alternates too)
and reporting medians and the ratio after / before:

- store commands where the data root is, on one store of `--rows` records
  (a SchemaSpec store; every command a fresh process, as an operator runs
  it): get of 10 keys, a filtered scan (1% of the rows), a scan of every
  row, a filtered count, a named query, an add of 1,000 records, status;
- the REST server benchmark (`dev bench-server`, or `bench-server` in builds
  before the `dev` group): HTTP p50 and throughput of single-record adds,
  1,000-record adds and gets from concurrent clients.

Both builds read the same data root (the registry and store formats did not
change between the builds this was written for; a build that cannot read it
fails loudly). Release builds only: debug figures say little.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SPEC = {
    "name": "bench",
    "key": "id",
    "columns": [
        {"name": "id", "type": "Utf8", "nullable": False},
        {"name": "team", "type": "Utf8"},
        {"name": "n", "type": "Int64"},
        {"name": "text", "type": "Utf8"},
    ],
    "queries": [
        {
            "name": "by_team",
            "description": "one team's records",
            "params": ["team"],
            "filter": "team = {team}",
            "order_by": ["id"],
        }
    ],
}


def records(prefix, start, n):
    return "".join(
        json.dumps(
            {
                "id": f"{prefix}{i:08d}",
                "team": f"t{i % 100}",
                "n": i,
                "text": "an observation of moderate length, for a benchmark",
            }
        )
        + "\n"
        for i in range(start, start + n)
    )


def run(binary, args, stdin=None):
    started = time.perf_counter()
    done = subprocess.run(
        [binary] + args,
        input=stdin,
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{binary} {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return took, done.stdout


def store_ops(root, rows):
    r = ["--root", root]
    keys = [f"k{i:08d}" for i in range(0, rows, max(1, rows // 10))][:10]
    lo = rows - rows // 100
    return [
        ("get 10 keys", lambda tag: (["store", "get", "bench", *keys, *r], None)),
        (
            "scan 1% (filter)",
            lambda tag: (["--json", "store", "scan", "bench", "--filter", f"n >= {lo}", *r], None),
        ),
        ("scan every row", lambda tag: (["--json", "store", "scan", "bench", *r], None)),
        (
            "count (filter)",
            lambda tag: (["--json", "store", "count", "bench", "--filter", f"n >= {lo}", *r], None),
        ),
        (
            "named query (1%)",
            lambda tag: (["--json", "store", "query", "bench", "by_team", "--arg", "team=t7", *r], None),
        ),
        (
            "add 1,000 records",
            lambda tag: (["--json", "store", "add", "bench", "-", *r], records(f"a{tag}-", 0, 1000)),
        ),
        ("status", lambda tag: (["--json", "store", "status", "bench", *r], None)),
    ]


SERVER_ROW = re.compile(
    r"^(add 1 record|add 1000 records|add 1,000 records|get by key)\s+.*\|\s*(\S+)\s+(\S+)\s+(\d+)\s*\|"
)


def duration(text):
    """A Rust `Duration` debug form (`812.34µs`, `8.30ms`, `1.20s`) in ms."""
    m = re.match(r"([\d.]+)(ns|µs|us|ms|s)$", text)
    if not m:
        return float("nan")
    scale = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]
    return float(m.group(1)) * scale


def server_bench(binary, clients):
    args = ["--clients", str(clients), "--single-adds", "400", "--bulk-adds", "20", "--gets", "2000"]
    help_text = subprocess.run([binary, "dev", "--help"], capture_output=True, text=True)
    command = ["dev", "bench-server"] if help_text.returncode == 0 else ["bench-server"]
    _, out = run(binary, command + args)
    figures = {}
    for line in out.splitlines():
        m = SERVER_ROW.match(line.strip())
        if m:
            name = m.group(1).replace("1000", "1,000")
            figures[f"HTTP {name} p50 (ms)"] = duration(m.group(2))
            figures[f"HTTP {name} records/s"] = float(m.group(4))
    if not figures:
        sys.exit(f"{binary}: no figures in bench-server's output:\n{out}")
    return figures


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--server-rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    a = p.parse_args()
    builds = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after)}
    work = tempfile.mkdtemp(prefix="compare-builds-")
    try:
        root = os.path.join(work, "root")
        spec = os.path.join(work, "spec.json")
        with open(spec, "w") as f:
            json.dump(SPEC, f)
        run(builds["after"], ["store", "create", "bench", "--spec", spec, "--root", root])
        run(builds["after"], ["store", "add", "bench", "-", "--root", root], records("k", 0, a.rows))
        run(builds["after"], ["store", "merge", "bench", "--root", root])
        times = {}  # (op, build) -> [seconds]
        ops = store_ops(root, a.rows)
        for round_ in range(a.rounds):
            order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
            for name, make in ops:
                for build in order:
                    args, stdin = make(f"{build}{round_}")
                    took, _ = run(builds[build], args, stdin)
                    times.setdefault((name, build), []).append(took * 1e3)
        server = {}  # (figure, build) -> [value]
        for round_ in range(a.server_rounds):
            order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
            for build in order:
                for figure, value in server_bench(builds[build], a.clients).items():
                    server.setdefault((figure, build), []).append(value)
        print(f"{a.rows} records, {a.rounds} rounds (store commands), {a.server_rounds} (server), "
              f"{a.clients} clients; medians; ratio = after / before")
        print(f"{'figure':<36} {'before':>12} {'after':>12} {'ratio':>7}")
        for name, _ in ops:
            b = statistics.median(times[(name, 'before')])
            f = statistics.median(times[(name, 'after')])
            print(f"{name + ' (ms)':<36} {b:>12.1f} {f:>12.1f} {f / b:>7.2f}")
        for figure in dict.fromkeys(k for k, _ in server):
            b = statistics.median(server[(figure, 'before')])
            f = statistics.median(server[(figure, 'after')])
            print(f"{figure:<36} {b:>12.2f} {f:>12.2f} {f / b:>7.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
