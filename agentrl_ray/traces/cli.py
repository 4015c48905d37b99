"""`agentrl-ray traces convert`: rollouts or agent logs -> datasets (`agentrl-ray sft` is `sft.py`).

agentrl-ray traces convert runs/calculator/rollouts --format sft --out data/calc_sft
agentrl-ray traces convert agent_logs.jsonl --format preference --out data/calc_dpo
"""

from __future__ import annotations

import argparse
import json

from agentrl_ray.config import ConfigError
from agentrl_ray.traces.convert import FORMATS, build_rows, save_dataset
from agentrl_ray.traces.records import read_records


def add_parsers(sub) -> None:
    traces = sub.add_parser("traces", help="turn rollouts or agent logs into SFT / KTO / preference / GRPO datasets")
    tsub = traces.add_subparsers(dest="traces_command", required=True)
    conv = tsub.add_parser("convert", help="trace .jsonl files (or a run dir) -> a datasets.save_to_disk folder")
    conv.add_argument("source", help="a .jsonl trace file, or a folder of them (a run dir, its rollouts/)")
    conv.add_argument("--format", required=True, choices=FORMATS)
    conv.add_argument("--out", required=True, help="output folder (datasets.save_to_disk)")
    conv.add_argument("--threshold", type=float, default=1.0, help="reward at which a trajectory counts as a success")


def run(args: argparse.Namespace) -> int:
    try:  # the user's files: a bad line or an unusable set of records is one line naming it
        records = read_records(args.source)
        rows = build_rows(records, args.format, args.threshold)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    ds = save_dataset(rows, args.out)
    print(json.dumps({"records": len(records), "rows": len(ds), "columns": ds.column_names, "out": args.out}))
    return 0
