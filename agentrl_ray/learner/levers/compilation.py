"""`learner.compile`: which models compile (`wants_compile`, `auto`'s rule) and compiling their decoder layers in place
(`compile_layers`), with the C++ compiler a CPU's inductor needs checked before any step."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("agentrl_ray")


COMPILE_AUTO_PARAMS = 200_000_000  # learner.compile=auto compiles models of at least this many parameters
# torch.compile's options for each layer. Dynamic shapes: one graph serves every micro-batch and sequence length
# (a run's batches change length every step). `benchmarks/run.py learner`'s `static` and `cudagraphs` levers
# change these to measure what a fixed shape, or CUDA graphs on top of it, would bring on a GPU.
LAYER_COMPILE_OPTIONS: dict = {"dynamic": True}
# What is compiled: "layers", each decoder layer (one graph that all of them share), or "stack", the module that
# holds the layers (embedding, every layer and the final norm in one graph: one call's host overhead per forward
# instead of one per layer; on a GPU the 0.5B step waits on the host for a fifth to a third of its time,
# docs/history/learner_speed.md round 3). `benchmarks/run.py learner`'s `stack` lever sets "stack". Runs compile
# layers: the stack's compilation took 125 s against 28 s layer by layer on a CPU (0.5B LoRA) and did not end in 270 s
# on an H100's host (0.5B full; docs/history/learner_speed.md round 4): inductor's fusion pass grows faster than the
# graph.
COMPILE_SCOPE = "layers"
# Each compiled layer's linears that read the same input (q/k/v, gate/up, and LoRA's A on each) run as one matmul
# (learner/levers/linear_fusion.py). Off until a GPU measures it (docs/history/learner_speed.md round 5): on a CPU the
# step was level with it, and the concatenated weights kept for backward raised the learner's peak RSS by 0.18-0.61 GiB
# at 0.5B (docs/history/benchmarks.md round 11). `benchmarks/run.py learner`'s `fuse` lever turns it on.
FUSE_SHARED_INPUT_LINEARS = False
# learner.compile_buckets: how many fixed-shape graphs of a layer torch keeps before it falls back to eager
FIXED_SHAPE_GRAPHS = 128


def wants_compile(
    setting, model, device: torch.device, partitioned: bool, rank: int, *, quantized: bool = False
) -> bool:
    """learner.compile resolved for this model and device: `true`/`false` as given; `auto` on for a model of at
    least COMPILE_AUTO_PARAMS parameters where compiling can run (not under ZeRO-3, a model naming its decoder
    layers, a C++ compiler on a CPU) and was measured (not a 4-bit QLoRA base), off otherwise (rank 0 says why when
    the size alone would have compiled)."""
    if setting != "auto":
        return bool(setting)
    n = sum(p.numel() for p in model.parameters())
    if n < COMPILE_AUTO_PARAMS:
        return False
    why = None
    if partitioned:
        why = "DeepSpeed ZeRO-3 partitions the parameters"
    elif quantized:
        why = "a 4-bit base (learner.lora.quantize) was not measured compiled; learner.compile=true to try it"
    elif not _decoder_layers(model):
        why = f"{type(model).__name__} names no repeated decoder layer"
    elif device.type == "cpu" and _cpp_compiler_missing():
        why = "no C++ compiler for torch.compile's inductor (g++ or clang; set CXX to choose one)"
    if why and rank == 0:
        log.info("learner.compile=auto: %.0fM parameters, but the layers stay eager: %s", n / 1e6, why)
    return why is None


def _layer_names(model) -> set[str]:
    """The class names the model gives in `_no_split_modules` (Hugging Face's list of its repeated blocks)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT wraps the HF model
    return set(getattr(base, "_no_split_modules", None) or ())


def _decoder_layers(model) -> list:
    """The modules of the classes `_layer_names` gives."""
    names = _layer_names(model)
    return [m for m in model.modules() if type(m).__name__ in names]


def compile_layers(model, device: torch.device, *, fixed_shapes: bool = False) -> int:
    """`torch.compile` each decoder layer in place (`nn.Module.compile`: parameter names and state dicts unchanged),
    with dynamic shapes so that one graph serves every layer, micro-batch and sequence length; the head and the
    embedding stay eager (chunked_logprobs runs the head). The layers are the modules whose class the model names in
    `_no_split_modules` (Hugging Face's list of its repeated blocks). Returns how many were compiled. With
    `fixed_shapes` (learner.compile_buckets) each shape the layers meet gets a graph of its own instead.

    On a CPU, inductor compiles C++ at the first step: a missing compiler is reported here, before any step runs."""
    if device.type == "cpu":
        _check_cpp_compiler()
    layers = _decoder_layers(model)
    if not layers:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        raise ValueError(
            f"learner.compile=true: {type(base).__name__} names no repeated decoder layer (_no_split_modules is "
            f"{sorted(_layer_names(model))}), so there is nothing to compile layer by layer; set learner.compile=false"
        )
    options = layer_compile_options()
    if fixed_shapes:
        options["dynamic"] = False
        # a graph per (rows, length, grad mode): torch's default of 8 recompilations per frame would send the rest
        # back to eager
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, FIXED_SHAPE_GRAPHS)
    if COMPILE_SCOPE == "stack":
        _stack_of(model, layers).compile(**options)
        return len(layers)
    for layer in layers:
        layer.compile(**options)
    return len(layers)


def layer_compile_options() -> dict:
    """`torch.compile`'s arguments for the layers: LAYER_COMPILE_OPTIONS, with the fusion of linears sharing an
    input as inductor's pre-grad pass where FUSE_SHARED_INPUT_LINEARS (torch.compile takes a `mode` or inductor
    `options`, not both: a `mode` keeps the linears apart)."""
    options = dict(LAYER_COMPILE_OPTIONS)
    if FUSE_SHARED_INPUT_LINEARS and "mode" not in options:
        from agentrl_ray.learner.levers.linear_fusion import FuseSharedInputLinears

        options["options"] = {**options.get("options", {}), "pre_grad_custom_pass": FuseSharedInputLinears()}
    return options


def _stack_of(model, layers: list):
    """The module whose ModuleList child holds the decoder layers (a Hugging Face model's `model.model`)."""
    for module in model.modules():
        for child in module.children():
            if isinstance(child, torch.nn.ModuleList) and any(c is layers[0] for c in child):
                return module
    raise ValueError(f"no module holds {type(layers[0]).__name__} in a ModuleList: compile the layers instead")


def _cpp_compiler_error() -> Exception | None:
    """Inductor's own compiler search: the error it raises where it finds no C++ compiler, else None. It is private
    to torch: where a torch version has moved it, None (inductor then reports a missing compiler itself, at the
    first step; rank 0 logs that the check was skipped)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:
        log.info("learner.compile: torch has no cpp_builder.get_cpp_compiler; the C++ compiler is checked at step 1")
        return None
    try:
        get_cpp_compiler()
    except Exception as e:  # inductor's InvalidCxxCompiler, or its search failing otherwise
        return e
    return None


def _cpp_compiler_missing() -> bool:
    return _cpp_compiler_error() is not None


def _check_cpp_compiler() -> None:
    """Reports a missing C++ compiler now rather than at the first step."""
    error = _cpp_compiler_error()
    if error is not None:
        raise RuntimeError(
            "learner.compile=true on a CPU needs a C++ compiler for torch.compile's inductor (g++ or clang; "
            f"set CXX to choose one) and none was found ({type(error).__name__}): install one (e.g. apt install g++) "
            "or set learner.compile=false"
        ) from error
