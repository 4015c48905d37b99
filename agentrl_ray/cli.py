"""agentrl-ray: command-line entry point.

    agentrl-ray train [CONFIG.yaml] [section.key=value ...]    train (local Ray, or the cluster at RAY_ADDRESS)
    agentrl-ray config [CONFIG.yaml] [section.key=value ...]   print the resolved config and exit
    agentrl-ray config --help                                  list every config key: type, default, description
    agentrl-ray plan [CONFIG.yaml] [overrides] [--nodes JSON]  print the placement plan (which actor on which node)
    agentrl-ray build-model [--rebuild]                        the built-in default model's folder (shipped or built)
    agentrl-ray traces convert SRC --format sft|kto|preference|grpo --out DIR   rollouts/logs -> HF datasets
    agentrl-ray sft SRC --model builtin:tiny --out DIR         supervised warm start on trace conversations
    agentrl-ray doctor                                         hardware found, and what each profile would run
    agentrl-ray eval | chat | export CHECKPOINT [...]          use a trained checkpoint (see --help of each)
    agentrl-ray view [RUN_DIR ...]                             a local web page of runs: curves, rollouts, evals

Examples (CPU, default task):     agentrl-ray train examples/calculator/config.yaml
  one GPU:                        agentrl-ray train examples/calculator/config.yaml profile=gpu
  a Ray cluster:                  ray job submit --working-dir . -- agentrl-ray train examples/calculator/config.yaml

Heavy imports (torch, Ray, vLLM) happen only after the arguments and the config have been validated.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
from pathlib import Path

from agentrl_ray.config import BUILTIN_MODELS, ConfigError, parse_overrides
from agentrl_ray.config import help as config_help
from agentrl_ray.infra import console, startup
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.infra.user_code import add_user_code_paths
from agentrl_ray.traces import cli as traces_cli
from agentrl_ray.traces import sft

# Commands with a module of their own (using a trained checkpoint; viewing runs): add_arguments(parser), main(args).
USE_COMMANDS = {
    "eval": ("agentrl_ray.trained.evaluate", "evaluate a checkpoint on held-out prompts (pass@k, transcripts)"),
    "chat": ("agentrl_ray.trained.chat", "talk to a checkpoint in the terminal, with its tools"),
    "export": ("agentrl_ray.trained.export", "export a checkpoint: merged HF model, LoRA adapter, or GGUF + Modelfile"),
    "view": ("agentrl_ray.view.server", "a local web page of runs: curves, health, rollouts, evals, comparisons"),
}
VERBOSE_HELP = "show the output of Ray, vLLM, DeepSpeed and transformers here, not in the run's log.txt"
# Commands whose output is a printout a user may pipe into `head`.
PRINTING_COMMANDS = frozenset({"config", "plan", "doctor"})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl-ray", description="Ray-distributed GRPO + ECHO for tool-using agents")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("train", "run training end to end"), ("config", "print the resolved config")):
        s = sub.add_parser(name, help=help_text, add_help=name != "config")
        if name == "config":  # its --help lists every config key (config/help.py)
            s.add_argument("-h", "--help", action="store_true", help="list every config key and exit")
        else:
            s.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
        s.add_argument(
            "args",
            nargs="*",
            metavar="CONFIG.yaml | key=value",
            help="an optional YAML config file, then dotted overrides such as learner.lr=1e-5",
        )
    plan = sub.add_parser("plan", help="print the placement plan for the cluster (or --nodes) without training")
    plan.add_argument("args", nargs="*", metavar="CONFIG.yaml | key=value")
    plan.add_argument("--nodes", help='a cluster to plan for: JSON such as \'[{"count": 4, "CPU": 96, "GPU": 8}]\'')
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument(
        "--measured",
        metavar="RUN_DIR",
        type=Path,
        help="a finished batch-pipeline run of a few steps: also print the expected balance of engines and learner",
    )
    build = sub.add_parser("build-model", help="build and cache a built-in model (default: the tiny default model)")
    build.add_argument("--size", default="tiny", choices=BUILTIN_MODELS, help="small: ~25M parameters")
    build.add_argument(
        "--rebuild",
        action="store_true",
        help="build it from its recipe into $AGENTRL_CACHE even where the package ships it (minutes on a CPU)",
    )
    traces_cli.add_parsers(sub)
    sft.add_parser(sub)
    doctor = sub.add_parser("doctor", help="print the hardware found and what each profile would run")
    doctor.add_argument("args", nargs="*", metavar="CONFIG.yaml | key=value", help="optional config and overrides")
    for name, (module, help_text) in USE_COMMANDS.items():  # these modules import nothing heavy at import time
        importlib.import_module(module).add_arguments(sub.add_parser(name, help=help_text))
    return p


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    path = None
    if args and "=" not in args[0]:
        path, args = args[0], args[1:]
    bad = [a for a in args if "=" not in a]
    if bad:
        raise SystemExit(f"agentrl-ray: expected key=value overrides after the config file, got {bad}")
    return path, args


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "plan":  # overrides written after --nodes
        args.args += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # User modules named in a config resolve from the working directory and the config's folder (user_code.py).
    config_args = getattr(args, "args", None) or []
    add_user_code_paths(config_args[0] if config_args and "=" not in config_args[0] else None)
    try:
        return _run(args)
    except BrokenPipeError:
        if args.command not in PRINTING_COMMANDS:
            raise
        # The reader closed the pipe early (`agentrl-ray config --help | head`): not an error. Python flushes stdout
        # again at exit, so point it at /dev/null first (the recipe of Python's `signal` docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command in USE_COMMANDS:
        try:
            return importlib.import_module(USE_COMMANDS[args.command][0]).main(args)
        except ConfigError as exc:
            print(f"agentrl-ray {args.command}: {exc}", file=sys.stderr)
            return 2
    if args.command == "build-model":
        from agentrl_ray.builtin.model import ensure_builtin_model

        print(ensure_builtin_model(size=args.size, force=args.rebuild, shipped=not args.rebuild))
        return 0
    if args.command == "config" and args.help:
        print(config_help.render())
        return 0
    if args.command in ("traces", "sft"):
        try:
            return (traces_cli if args.command == "traces" else sft).run(args)
        except ConfigError as exc:  # the trace files, the model folder
            print(f"agentrl-ray {args.command}: {exc}", file=sys.stderr)
            return 2
    path, overrides = _split(args.args)
    try:
        cfg = load_config(path, overrides)
    except ConfigError as exc:
        print(f"agentrl-ray: config error: {exc}", file=sys.stderr)
        return 2
    if args.command == "doctor":
        from agentrl_ray.infra.doctor import main as doctor_main

        return doctor_main(path, overrides)
    if args.command == "config":
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    if args.command == "plan":
        from agentrl_ray.infra.plan_cmd import show

        try:
            show(cfg, args.nodes, args.json, args.measured)
        except ConfigError as exc:  # PlacementError included: the cluster cannot hold the plan
            print(f"agentrl-ray: {exc}", file=sys.stderr)
            return 2
        return 0
    startup.mark("driver", "config parsed")
    from agentrl_ray.driver import fresh_run_name, train
    from agentrl_ray.types import RunStopped

    if not cfg.run.resume and "name" not in parse_overrides(overrides).get("run", {}):
        # A name from the YAML or the default names a kind of run, not this one: an earlier run of that name is
        # kept and this one gets the next free name. A name given on the command line is used as given.
        earlier, cfg.run.name = cfg.run_dir, fresh_run_name(cfg.run)
        if cfg.run_dir != earlier:
            print(
                f"agentrl-ray: {earlier} holds an earlier run (continue it with run.name={earlier.name} "
                f"run.resume=true); this run is {cfg.run.name}: {cfg.run_dir}"
            )
    verbose = args.verbose or cfg.run.log_level == "debug"
    try:
        with contextlib.nullcontext() if verbose else console.quiet(cfg.run_dir / "log.txt"):
            metrics = train(cfg)
    except ConfigError as exc:
        print(f"agentrl-ray: {exc}", file=sys.stderr)
        return 2
    except RunStopped as exc:  # a guard stopped the run on purpose; its checkpoints are intact
        print(f"agentrl-ray: the run stopped: {exc}", file=sys.stderr)
        return 1
    evals = {k: round(v, 4) for k, v in metrics.items() if k.startswith("eval/")}
    print(f"done: {cfg.run_dir} {json.dumps(evals)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
