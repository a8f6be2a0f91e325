#!/usr/bin/env python3
"""NFS export against NBD export of the same lograid volume, with the same client load.

Builds qd_driver.c (libnfs-dev, libnbd-dev), creates a pool of sparse member files in a
temporary directory, starts `lograid serve --nfs`, and runs each workload over NBD and over NFS
alternately (the order swapped every repetition): sequential 1 MiB writes and reads, random
4 KiB writes and reads, at queue depth 32 on one connection, SECONDS each. Prints every run (with
the CPU seconds the server and the client used in it, per GiB moved) and the medians as NFS/NBD
ratios. The server is stopped (SIGTERM) at the end.

    python3 bench/nfs/nfs_vs_nbd.py --lograid target/release/lograid [--seconds 10] [--repeats 3]
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = [("seqwrite", 1 << 20), ("seqread", 1 << 20), ("randwrite", 4096), ("randread", 4096)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline):
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"server did not listen on {port}")


def cpu_seconds(pid):
    """User and system CPU seconds of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_driver(driver, proto, nbd_port, nfs_port, workload, size, args):
    common = [workload, str(args.region_mib), str(size), str(args.qd), str(args.seconds)]
    if proto == "nfs":
        cmd = [driver, "nfs", "127.0.0.1", str(nfs_port), "vol0"] + common
    else:
        cmd = [driver, "nbd", f"nbd://127.0.0.1:{nbd_port}/vol0"] + common
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
    return float(out[6]), float(out[7]), float(out[8]), int(out[4]) * size / 2**30


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lograid", required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--qd", type=int, default=32)
    parser.add_argument("--region-mib", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lograid-nfs-bench-") as work:
        driver = os.path.join(work, "qd_driver")
        subprocess.run(["cc", "-O2", "-o", driver, os.path.join(HERE, "qd_driver.c"), "-lnfs", "-lnbd"],
                       check=True)
        drives = [os.path.join(work, f"m{i}.img") for i in range(3)]
        subprocess.run([args.lograid, "create", "--size", "4G", "--parity", "1",
                        "--volume", f"vol0:{2 * args.region_mib}M"] + drives, check=True,
                       capture_output=True)
        nbd_port, nfs_port = free_port(), free_port()
        log = open(os.path.join(work, "serve.log"), "w")
        server = subprocess.Popen([args.lograid, "serve", *drives, "--listen", f"127.0.0.1:{nbd_port}",
                                   "--nfs", f"127.0.0.1:{nfs_port}"], stdout=log, stderr=log)
        try:
            wait_port(nbd_port, time.time() + 60)
            wait_port(nfs_port, time.time() + 5)
            results = {}
            for repeat in range(args.repeats):
                for workload, size in WORKLOADS:
                    order = ["nbd", "nfs"] if repeat % 2 == 0 else ["nfs", "nbd"]
                    for proto in order:
                        server_before = cpu_seconds(server.pid)
                        mib_s, iops, client_cpu, gib = run_driver(driver, proto, nbd_port, nfs_port,
                                                                  workload, size, args)
                        server_cpu = cpu_seconds(server.pid) - server_before
                        results.setdefault((workload, proto), []).append((mib_s, iops))
                        print(f"run {repeat + 1} {proto} {workload} {size} B QD{args.qd}: "
                              f"{mib_s:.1f} MiB/s {iops:.0f} IOPS; CPU s per GiB: server "
                              f"{server_cpu / gib:.2f}, client {client_cpu / gib:.2f}; "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)
            print(f"\nmedians of {args.repeats} ({args.seconds:g} s each, QD{args.qd}, one connection):")
            print("| workload | NBD | NFS | NFS/NBD |")
            print("|---|---|---|---|")
            for workload, size in WORKLOADS:
                # Sequential loads in MiB/s, random ones in IOPS (the ratio is the same).
                column, unit = (0, "MiB/s") if size > 4096 else (1, "IOPS")
                nbd = statistics.median(r[column] for r in results[(workload, "nbd")])
                nfs = statistics.median(r[column] for r in results[(workload, "nfs")])
                print(f"| {workload} {size // 1024} KiB | {nbd:,.0f} {unit} | {nfs:,.0f} {unit} | {nfs / nbd:.2f} |")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)


if __name__ == "__main__":
    main()
