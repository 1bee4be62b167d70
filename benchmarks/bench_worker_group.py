"""Time to bring up a worker group of 4 (Ray init + actors + gloo + meshes) and a DataProto dispatch round trip.

Usage: python benchmarks/bench_worker_group.py [--world 4] [--launcher ray|local|both] [--rows 1024] [--repeats 20]
Prints one line per figure; the goal on the 2-core CPU machine is < 10 s to bring up 4 ranks. The local launcher runs
twice: cold (its fork server imports torch/tensordict once) and warm (ranks forked from the running fork server)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from labkit.protocol.data_proto import DataProto  # noqa: E402
from labkit.runtime.demo_worker import DemoWorker  # noqa: E402
from labkit.runtime.ray_init import import_ray, ray_available  # noqa: E402
from labkit.runtime.worker_group import WorkerGroup  # noqa: E402


def load() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def cpu_seconds(pid: int) -> float:
    """user+system CPU seconds a process has used so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(launcher: str, world: int, rows: int, repeats: int) -> dict[str, float]:
    """Bring-up and call timings of one worker group (it starts and stops Ray itself when launcher='ray')."""
    t0 = time.perf_counter()
    ray_init = 0.0
    if launcher == "ray":
        from labkit.runtime.ray_launcher import start_ray

        start_ray(num_cpus=max(4, world))
        ray_init = time.perf_counter() - t0
    t1 = time.perf_counter()
    wg = WorkerGroup(DemoWorker, world, launcher=launcher, init_kwargs={"sp": 2 if world % 2 == 0 else 1})
    up = time.perf_counter() - t1
    rank_cpu = [cpu_seconds(p) for p in wg.pids]
    try:
        mask = torch.ones(rows, 256, dtype=torch.long)
        data = DataProto.from_dict(
            tensors={
                "row_id": torch.arange(rows),
                "attention_mask": mask,
                "input_ids": torch.randint(0, 500, (rows, 256)),
            }
        )
        first = time.perf_counter()
        wg.echo(0)
        first = time.perf_counter() - first
        trips = {}
        for name, call in (
            ("echo (ONE_TO_ALL, tiny)", lambda: wg.echo(0)),
            ("all_reduce_rank (gloo)", wg.all_reduce_rank),
            (f"compute (DP_COMPUTE_PROTO, {rows}x256 x2 int64)", lambda: wg.compute(data)),
            (f"actor_compute (mesh 'actor', {rows} rows)", lambda: wg.actor_compute(data)),
        ):
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            trips[name] = statistics.median(times)
    finally:
        t2 = time.perf_counter()
        wg.close()
        close = time.perf_counter() - t2
        t3 = time.perf_counter()
        if launcher == "ray":
            import_ray().shutdown()
        shutdown = time.perf_counter() - t3
    return {
        "ray_init": ray_init,
        "group_up": up,
        "bring_up_total": ray_init + up,
        "rank CPU-seconds at ready (sum)": sum(rank_cpu),
        "rank CPU-seconds at ready (max)": max(rank_cpu),
        "first_call": first,
        **trips,
        "close": close,
        "ray_shutdown": shutdown,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--launcher", default="both", choices=["ray", "local", "both"])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    launchers = ["ray", "local"] if args.launcher == "both" else [args.launcher]
    if "ray" in launchers and not ray_available():
        print("ray: not installed, skipped")
        launchers.remove("ray")
    print(f"machine: {os.cpu_count()} CPUs, load average {load()} at start; world size {args.world}")
    # local twice: the first group starts the fork server (one torch/tensordict import), the second reuses it
    runs = [(lab, lab) for lab in launchers if lab == "ray"] + [("local", "local-cold"), ("local", "local-warm")] * (
        "local" in launchers
    )
    for launcher, label in runs:
        figures = bench(launcher, args.world, args.rows, args.repeats)
        for name, value in figures.items():
            unit = f"{value * 1e3:8.1f} ms" if value < 1 else f"{value:8.2f} s "
            print(f"{label:10s} {name:48s} {unit}")
        goal = figures["bring_up_total"]
        print(
            f"{label:10s} {'bring-up goal < 10 s':48s} {'met' if goal < 10 else 'NOT met'} ({goal:.1f} s, "
            f"load average now {load()})"
        )


if __name__ == "__main__":
    main()
