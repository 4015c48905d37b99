"""Which processes of a running training hold its memory: sample /proc every 2 s while a run is up and keep the
sample with the largest total PSS, summed per process name (RSS, PSS, count).

    python benchmarks/process_memory.py --out benchmarks/results/process_memory-tiny.json &   # then start a run
    python benchmarks/trl_side_by_side.py ...                                                  # or any train

It watches Ray's processes (`ray::*`, gcs_server, raylet, the dashboard's) and any command line naming agentrl_ray,
from the moment a `ray::RolloutWorker` appears until it is gone again (one run), or `--seconds`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path


def _sample() -> dict[str, list[int]]:
    """{process name: [RSS KiB, PSS KiB, count]} over the processes of a run."""
    snap: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
            rss = pss = 0
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
        except OSError:
            continue  # the process ended meanwhile
        ours = "agentrl_ray" in cmd or "ray/" in cmd
        if ours or name.startswith(("ray", "Ray", "gcs_server")):
            row = snap[name]
            row[0], row[1], row[2] = row[0] + rss, row[1] + pss, row[2] + 1
    return snap


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=1800)
    a = p.parse_args()
    peak: dict[str, list[int]] = {}
    seen, end = False, time.time() + a.seconds
    while time.time() < end:
        snap = _sample()
        if any(k.startswith("ray::RolloutW") for k in snap):
            seen = True
            if sum(v[1] for v in snap.values()) > sum(v[1] for v in peak.values()):
                peak = dict(snap)
        elif seen:
            break
        time.sleep(2)
    rows = sorted(peak.items(), key=lambda kv: -kv[1][1])
    out = {
        "total_rss_gib": sum(v[0] for _, v in rows) / 2**20,
        "total_pss_gib": sum(v[1] for _, v in rows) / 2**20,
        "processes": {k: {"rss_mib": v[0] / 1024, "pss_mib": v[1] / 1024, "count": v[2]} for k, v in rows},
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    for k, v in rows:
        print(f"{k:<28} x{v[2]:<3} RSS {v[0] / 1024:7.0f} MiB  PSS {v[1] / 1024:7.0f} MiB")
    print(f"total: RSS {out['total_rss_gib']:.2f} GiB, PSS {out['total_pss_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
