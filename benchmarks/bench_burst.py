#!/usr/bin/env python3
"""What the emulated links' token bucket lets through: a transfer after idle, and a long one.

For each ``--bursts`` value, a 2-host cluster at ``--bandwidth`` (hosts time-sharing the cores,
so nothing but the link is measured); host 0 sends ``SIZE`` bytes over TCP to host 1 after
``IDLE_S`` of silence (the bucket refills, as on a pipeline link between two compute phases)
and waits for a one-byte reply; ``--trials`` times, median. Prints the effective rate as a
fraction of the line rate: 1.0 is a link that holds its rate from the first byte; above 1 the
bucket's burst carried part of the transfer faster than the line.

Needs root and iproute2. Usage:
    python benchmarks/bench_burst.py [--bursts auto,16KiB,128KiB] [--bandwidth 1gbit] [--trials 9] [--gso 6KiB]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap

from realrun.cluster import EmulatedSpec, down, launch, netns, up
from realrun.cluster.emulated import link_shape
from topologies.units import parse_rate, parse_size

SIZES = (64 * 1024, 256 * 1024, 1024 * 1024, 16 * 2**20)
IDLE_S = 0.05
PORT = 29641

PAIR = textwrap.dedent("""
    import json, os, socket, statistics, sys, time
    sizes, trials, idle, port, out = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), \\
        int(sys.argv[4]), sys.argv[5]
    rank = int(os.environ["RANK"])
    if rank == 1:
        srv = socket.create_server(("0.0.0.0", port))
        conn, _ = srv.accept()
        for size in sizes:
            for _ in range(trials):
                got = 0
                while got < size:
                    got += len(conn.recv(1 << 20))
                conn.sendall(b"k")
        sys.exit(0)
    for _ in range(200):
        try:
            conn = socket.create_connection((os.environ["MASTER_ADDR"].rsplit(".", 1)[0] + ".2", port))
            break
        except OSError:
            time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    result = {}
    for size in sizes:
        data, times = b"x" * size, []
        for _ in range(trials):
            time.sleep(idle)
            start = time.perf_counter()
            conn.sendall(data)
            conn.recv(1)
            times.append(time.perf_counter() - start)
        result[size] = statistics.median(times)
    with open(out, "w") as h:
        json.dump(result, h)
""")


def measure(burst: int | None, bandwidth: int, trials: int, gso: int = 0) -> dict:
    name = "bburst"
    up(EmulatedSpec(hosts=2, bandwidth=bandwidth, burst_bytes=burst, cpus_per_host="none"), name)
    if gso:
        for ns, dev in ((f"cmp-{name}-h0", "eth0"), (f"cmp-{name}-h1", "eth0"), (f"cmp-{name}-sw", "h0"),
                        (f"cmp-{name}-sw", "h1")):
            netns.sh("ip", "link", "set", "dev", dev, "gso_max_size", str(gso), ns=ns)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script, out = os.path.join(tmp, "pair.py"), os.path.join(tmp, "out.json")
            with open(script, "w") as h:
                h.write(PAIR)
            launch.run(name, [sys.executable, script, json.dumps(SIZES), str(trials), str(IDLE_S), str(PORT), out],
                       timeout_s=300)
            with open(out) as h:
                return {int(k): v for k, v in json.load(h).items()}
    finally:
        down(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", default="auto,128KiB",
                    help="bucket sizes to try; auto: what realrun cluster up sets (emulated.link_shape)")
    ap.add_argument("--bandwidth", default="1gbit")
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--gso", default="0", help="GSO segment limit on every link (0: the kernel's 64 KiB)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rate = parse_rate(args.bandwidth)
    bursts = [None if b.strip() == "auto" else parse_size(b.strip(), "bursts") for b in args.bursts.split(",")]
    gso = parse_size(args.gso, "gso") if args.gso != "0" else 0
    results = {b: measure(b, rate, args.trials, gso) for b in bursts}
    if args.json:
        print(json.dumps({str(b): r for b, r in results.items()}, indent=2))
        return
    print(f"rate over line rate ({args.bandwidth}; transfer after {IDLE_S * 1e3:g} ms idle, median of "
          f"{args.trials}):")
    print(f"{'burst':>10s} " + " ".join(f"{s // 1024:>8d}K" for s in SIZES))
    for b, r in results.items():
        label = f"{b // 1024}K" if b else f"auto {link_shape(rate)[1] // 1024}K"
        print(f"{label:>10s} " + " ".join(f"{s * 8 / r[s] / rate:9.2f}" for s in SIZES))


if __name__ == "__main__":
    main()
