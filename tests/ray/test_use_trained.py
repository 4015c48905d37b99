"""From a trained run to a usable model, for a full and a LoRA run trained once (a few real steps) and shared:
`eval` reproduces the run's final held-out success; `export merged` loads in transformers and its greedy output
equals the vLLM engine's; `export gguf` (llama.cpp's converter) loads in transformers' GGUF reader and its greedy
output agrees with the Hugging Face model's; `export lora` is a PEFT adapter that gives the merged model back."""

import json
import os
import pty
import select
import sys
import time

import pytest
import torch

from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.trained.evaluate import evaluate_checkpoint
from agentrl_ray.trained.export import export
from agentrl_ray.trained.inference import Agent

RUN = [
    "profile=cpu",
    "rollout.prompts_per_step=8",
    "rollout.group_size=4",
    "data.train_size=64",
    "data.eval_size=16",
    "run.eval_samples=2",
    "run.eval_every=0",
    "run.eval_at_start=false",
    "run.checkpoint_every=0",
    "run.plot=false",
    "learner.lr=1e-3",
    "run.steps=4",
]
VARIANTS = {"full": [], "lora": ["profile=lora", "learner.lora.r=8", "learner.lr=5e-3"]}
NEW_TOKENS = 24


class _Runs(dict):
    """The trained runs by variant, each trained on first use and kept for the module: make test's tier uses the
    LoRA run alone, so it trains that one only."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def __missing__(self, name):
        cfg = load_config(None, [*RUN, *VARIANTS[name], f"run.output_dir={self.out}", f"run.name={name}"])
        self[name] = (cfg.run_dir, train(cfg))
        return self[name]


@pytest.fixture(scope="module")
def runs(local_ray, builtin_model_path, tmp_path_factory):
    return _Runs(tmp_path_factory.mktemp("runs"))


def _prompts(tokenizer, n=8):
    from agentrl_ray.envs.builtin.calculator import CalculatorEnv
    from agentrl_ray.envs.tools import tool_schemas

    questions = [f"What is {a} {op} {b}?" for a, op, b in [(347, "*", 29), (12, "+", 980), (500, "-", 123)]]
    questions += ["What is 17 * 23?", "Hello", "What is 999 + 1?", "Compute 45 * 45.", "What is 1000 - 1?"]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}],
            tools=tool_schemas(CalculatorEnv),
            add_generation_prompt=True,
            return_dict=False,
        )
        for q in questions[:n]
    ]


def _hf_greedy(model, prompts):
    """Greedy continuations of up to NEW_TOKENS tokens, ending with the end-of-turn token if one comes."""
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
        out.append(gen[0, len(p) :].tolist())
    return out


def _until_eos(ids, eos):
    # The engine's check generates past the end of turn (ignore_eos); transformers stops there.
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def _agreeing_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _eval_in_a_terminal(run_dir, out):
    import subprocess

    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    cmd = [sys.executable, "-m", "agentrl_ray.cli", "eval", str(run_dir), "--out", str(out)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    log = out / "log.txt"
    assert lines[0] == f"agentrl-ray: the output of Ray, vLLM and torch goes to {log} (--verbose shows it here)"
    result = [line for line in lines[1:] if not line.startswith("agentrl-ray: ")]  # our warnings may come too
    assert len(result) == 1 and result[0].startswith("16 prompts x 2 samples: pass@1 "), lines
    assert log.is_file()
    return json.loads((out / "report.json").read_text())


@pytest.mark.parametrize(
    "name", [pytest.param("full", marks=pytest.mark.long), pytest.param("lora", marks=pytest.mark.integration)]
)
def test_eval_reproduces_run_then_exports_round_trip(runs, name, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, metrics = runs[name]
    if name == "full":  # as a user types it: the console shows our lines only, Ray's and vLLM's go to the log
        report = _eval_in_a_terminal(run_dir, tmp_path / "eval")
    else:
        report = evaluate_checkpoint(run_dir, out=tmp_path / "eval")
    assert report["step"] == 4 and report["prompts"] == 16 and report["samples_per_prompt"] == 2
    # Same rows, temperature, seed, workers and weights as the run's final evaluation: the same samples.
    assert report["success"] == metrics["eval/success"]
    lo, hi = report["pass@1_ci95"]
    assert lo <= report["pass@1"] <= hi and report["pass@2"] >= report["pass@1"]
    # The run's own evaluation reported the same interval and pass@k (eval_stats, shared by both).
    assert [metrics["eval/pass@1_ci95_lo"], metrics["eval/pass@1_ci95_hi"]] == [lo, hi]
    assert metrics["eval/pass@2"] == pytest.approx(report["pass@2"])  # sums over prompts in either order
    assert metrics["eval/pass@1"] == pytest.approx(report["pass@1"])
    records = [json.loads(line) for line in (tmp_path / "eval" / "transcripts.jsonl").read_text().splitlines()]
    assert len(records) == 32
    assert sum(r["success"] for r in records) / 32 == report["success"]
    first = records[0]["messages"]
    assert first[0]["role"] == "user" and first[-1]["role"] in ("assistant", "tool")
    calls = [m for r in records for m in r["messages"] if m.get("tool_calls")]
    for m in calls:  # OpenAI style: arguments as a JSON string, each tool reply names its call
        json.loads(m["tool_calls"][0]["function"]["arguments"])

    merged = export(run_dir, "merged", tmp_path / "merged")
    tokenizer = AutoTokenizer.from_pretrained(merged)
    hf = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    prompts = _prompts(tokenizer)
    expected = _hf_greedy(hf, prompts)
    with Agent.load(run_dir, rewards=False) as agent:
        engine = [_until_eos(ids, tokenizer.eos_token_id) for ids, _ in agent.pool.greedy(prompts, NEW_TOKENS)[0]]
    assert engine == expected, "vLLM greedy output differs from transformers' on the merged export"

    if name == "lora":
        from peft import PeftModel

        adapter = export(run_dir, "lora", tmp_path / "lora")
        base = AutoModelForCausalLM.from_pretrained(
            json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"], dtype=torch.float32
        )
        peft_model = PeftModel.from_pretrained(base, adapter).merge_and_unload()
        assert _hf_greedy(peft_model, prompts[:3]) == expected[:3]

    agreement = {}
    # The quantization is llama.cpp's and the same for either run: q8_0 once, on the full run's weights.
    for quant in ("f16", "q8_0") if name == "full" else ("f16",):
        folder = export(run_dir, "gguf", tmp_path / f"gguf-{quant}", quant=quant)
        gguf = folder / f"model-{quant}.gguf"
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32)
        got = _hf_greedy(model, prompts)
        agreement[quant] = sum(_agreeing_prefix(a, b) for a, b in zip(got, expected))
        text = (folder / "Modelfile").read_text()
        assert f"FROM ./{gguf.name}" in text and 'PARAMETER stop "<|im_end|>"' in text
        assert "calculator(expression: string)" in text and "<tool_call>" in text
    total = sum(len(e) for e in expected)
    with capsys.disabled():
        print(
            f"\n[{name}] eval success {report['success']:.3f} (run {metrics['eval/success']:.3f}); greedy tokens "
            f"agreeing with HF: engine {total}/{total}, "
            + ", ".join(f"gguf {q} {n}/{total}" for q, n in agreement.items())
        )
    assert agreement["f16"] >= 0.9 * total


@pytest.mark.long
def test_chat_in_a_terminal(runs):
    """A person types a question in a real terminal (a pty), the model calls the calculator, the answer comes back."""
    import ray

    run_dir, _ = runs["full"]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "agentrl_ray.cli", "chat", str(run_dir)]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the chat, on the terminal's side
        os.execvpe(cmd[0], cmd, env)
    screen = ""

    def read_until(text, timeout=180.0):
        nonlocal screen
        deadline = time.monotonic() + timeout
        while text not in screen and time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:
                try:
                    screen += os.read(fd, 4096).decode(errors="replace")
                except OSError:
                    break
        assert text in screen, f"no {text!r} on the terminal:\n{screen[-3000:]}"

    try:
        read_until("you> ")
        os.write(fd, b"What is 347 * 29?\n")
        read_until("agent> ")
        read_until("you> ")
        os.write(fd, b"/quit\n")
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert os.waitstatus_to_exitcode(status) == 0
    reply = screen.split("What is 347 * 29?", 1)[1]
    assert '[tool call] calculator({"expression": ' in reply, reply
    assert "[tool result] " in reply and "agent> " in reply
    # Only the conversation: what Ray, vLLM and torch print went to the run folder's chat_log.txt, named first.
    first = screen.lstrip().splitlines()[0]
    assert first.startswith("agentrl-ray: the output of Ray, vLLM and torch goes to ") and "chat_log.txt" in first
    lines = [line for line in screen.splitlines() if line.strip()]
    assert all(
        line.startswith(("agentrl-ray: ", "chatting with", "you> ", "agent> ", "  [", "  (", " " * 7)) for line in lines
    ), screen
