#!/usr/bin/python3
"""Draws docs/img/*.png from the raw data in docs/data/ (see docs/benchmarks.md).

Usage: make plots   (or /usr/bin/python3 docs/plot.py; needs python3-matplotlib)
"""
import json
import os
import re
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
IMG = os.path.join(HERE, "img")

# scenario -> (key, Go client-go/context figure, kwq goal) from shared/bench/SCENARIOS.md
PEERS = {
    "fifo_1t": ("ns_per_item", 1000, 60),
    "pc_2w": ("ns_per_item", 514, 150),
    "dedup_hot": ("ns_per_add", 79, 25),
    "delay": ("ns_per_addafter", 1283, 150),
    "ratelimited": ("ns_per_reconcile", 1524, 200),
    "mem": ("bytes_per_queued_key", 124, 48),
    "ctx_child_create_cancel": ("ns_per_op", 161, 60),
    "ctx_timeout_create_cancel": ("ns_per_op", 389, 100),
    "ctx_wide_cancel_1M": ("ms", 201, 50),
    "ctx_deep_cancel_100k": ("ms", 115, 10),
    "ctx_err_check": ("ns_per_op", 4.7, 1),
}


def last_block(path):
    """Lines of the newest block (after the last '#' header) of scenarios.txt."""
    block = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                block = []
            elif line.strip():
                block.append(line.split())
    return block


def scenario_runs():
    """scenario -> list of {key: value} dicts, newest block only."""
    runs = {}
    for fields in last_block(os.path.join(DATA, "scenarios.txt")):
        kv = dict(f.split("=", 1) for f in fields[1:])
        runs.setdefault(fields[0], []).append(kv)
    return runs


def median(runs, name, key):
    return statistics.median(float(r[key]) for r in runs[name])


def scenario_medians():
    runs = scenario_runs()
    return {n: median(runs, n, PEERS[n][0]) for n in PEERS if n in runs}


def plot_scenarios():
    med = scenario_medians()
    names = [n for n in PEERS if n in med]
    fig, ax = plt.subplots(figsize=(13, 4.5))
    xs = range(len(names))
    w = 0.27
    go = [PEERS[n][1] for n in names]
    goal = [PEERS[n][2] for n in names]
    kwq = [med[n] for n in names]
    nruns = len(scenario_runs()[names[0]])
    ax.bar([x - w for x in xs], go, w, label="Go (SCENARIOS.md)")
    ax.bar(list(xs), goal, w, label="kwq goal")
    ax.bar([x + w for x in xs], kwq, w, label=f"kwq measured (median of {nruns})")
    ax.set_yscale("log")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{n}\n({PEERS[n][0]})" for n in names], fontsize=7, rotation=25,
                       ha="right")
    ax.set_ylabel("lower is better (log scale)")
    ax.set_title("Queue and context scenarios vs client-go / Go (2-core machine)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, "scenarios.png"), dpi=110)


def plot_wq_tiny():
    """The newest block of data/wq_tiny_interleaved.txt (kwq and its peers, interleaved)."""
    path = os.path.join(DATA, "wq_tiny_interleaved.txt")
    header = ""
    runs = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                header, runs = line, {}
            elif line.strip():
                fields = line.split()
                kv = dict(x.split("=", 1) for x in fields[1:])
                runs.setdefault(fields[0], []).append(kv)
    names = [n for n in ("wq_tiny", "wq_tiny_asio", "wq_tiny_tbb") if n in runs
             and "ns_per_item" in runs[n][0]]
    if not names:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    label = {"wq_tiny": "kwq", "wq_tiny_asio": "boost::asio", "wq_tiny_tbb": "oneTBB"}
    color = {"wq_tiny": "tab:green", "wq_tiny_asio": "tab:blue", "wq_tiny_tbb": "tab:orange"}
    bars = [(label[n], median(runs, n, "ns_per_item"), color[n]) for n in names]
    # Newer blocks also time making kwq's Work objects (the peers allocate per post).
    if "wq_tiny" in names and "with_create_ns_per_item" in runs["wq_tiny"][0]:
        bars.insert(1, ("kwq, Work made\nper item", median(runs, "wq_tiny",
                                                          "with_create_ns_per_item"),
                        "tab:olive"))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_ylabel("ns per work item (lower is better)")
    commit = re.search(r"commit (\w+)", header)
    ax.set_title("wq_tiny: 1,000,000 tiny works, one worker per CPU\n"
                 f"medians of {len(runs[names[0]])} interleaved rounds"
                 + (f", commit {commit.group(1)}" if commit else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, "wq_tiny.png"), dpi=110)

def plot_timers():
    with open(os.path.join(DATA, "timer_bench.json")) as f:
        bench = json.load(f)["benchmarks"]
    lat = [b for b in bench if b["name"].startswith("BM_Lateness100k")]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    keys = ["late_p50_us", "late_p99_us", "late_max_us"]
    w = 0.35
    for i, b in enumerate(lat):
        ax.bar([k + i * w for k in range(len(keys))], [b[k] for k in keys], w,
               label=b.get("label", b["name"]))
    ax.set_xticks([k + w / 2 for k in range(len(keys))])
    ax.set_xticklabels(["p50", "p99", "max"])
    ax.set_yscale("log")
    ax.set_ylabel("lateness (us, log scale)")
    ax.set_title("Timer lateness with 100,000 armed timers")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, "timer_lateness.png"), dpi=110)


def plot_scaling():
    """data/scaling_16cpu.txt: medians per scenario and CPU count (bench/scaling.sh)."""
    path = os.path.join(DATA, "scaling_16cpu.txt")
    if not os.path.exists(path):
        return
    per = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            fields = line.split()
            cpus = int(fields[0].split("=")[1])
            kv = dict(x.split("=", 1) for x in fields[2:])
            if "ns_per_item" in kv:
                per.setdefault(fields[1], {}).setdefault(cpus, []).append(
                    float(kv["ns_per_item"]))
    groups = [("thread pools, one producer", ["wq_tiny", "wq_tiny_tbb", "wq_tiny_asio"]),
              ("workqueues, one producer per CPU", ["wq_percpu", "wq_unbound_mp"]),
              ("Queue / ShardedQueue", ["pc_nw", "mpmc_queue", "mpmc_sharded"])]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (title, names) in zip(axes, groups):
        for n in names:
            if n not in per:
                continue
            xs = sorted(per[n])
            ax.plot(xs, [statistics.median(per[n][x]) for x in xs], marker="o", label=n)
        ax.set_xscale("log", base=2)
        ax.set_xticks([2, 4, 8, 16])
        ax.set_xticklabels(["2", "4", "8", "16"])
        ax.set_xlabel("CPUs (taskset)")
        ax.set_ylabel("ns per item, wall (lower is better)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("Scaling on the 16-CPU device machine (medians of 3 interleaved rounds)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, "scaling.png"), dpi=110)


if __name__ == "__main__":
    os.makedirs(IMG, exist_ok=True)
    plot_scenarios()
    plot_wq_tiny()
    plot_timers()
    plot_scaling()
    print("wrote", ", ".join(sorted(os.listdir(IMG))))
