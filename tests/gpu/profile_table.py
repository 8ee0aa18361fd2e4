#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum`)
per kernel: launches, total and mean time, DRAM read rate. Usage: profile_table.py FILE.csv"""
import csv
import sys
from collections import defaultdict


def rows(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines first
    return csv.DictReader(lines)


def main(path):
    by_kernel = defaultdict(lambda: {"n": 0, "ns": 0.0, "bytes": 0.0})
    for r in rows(path):
        name = r.get("Kernel Name", "?").split("(")[0][:60]
        k = by_kernel[name]
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        if r["Metric Name"] == "gpu__time_duration.sum":
            k["n"] += 1
            k["ns"] += value * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6}.get(unit, 1)
        elif r["Metric Name"] == "dram__bytes_read.sum":
            k["bytes"] += value * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
    total = sum(k["ns"] for k in by_kernel.values()) or 1
    print(f"{path}: {total / 1e3:.1f} µs of kernel time over the profiled launches\n")
    print("| kernel | launches | total (µs) | share | mean (µs) | DRAM read (TB/s) |")
    print("|---|---|---|---|---|---|")
    for name, k in sorted(by_kernel.items(), key=lambda kv: -kv[1]["ns"]):
        rate = k["bytes"] / k["ns"] / 1e3 if k["ns"] else 0.0
        print(f"| `{name}` | {k['n']} | {k['ns'] / 1e3:.1f} | {k['ns'] / total:.1%} | "
              f"{k['ns'] / max(k['n'], 1) / 1e3:.1f} | {rate:.2f} |")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
        print()
