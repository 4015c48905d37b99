"""Start-up marks (agentrl_ray/infra/startup.py) are written only when asked for, one JSON line each, and the
start-up benchmark's --phases reads them into a timeline with each process's start first."""

import json
from pathlib import Path

from agentrl_ray.infra import startup

ROOT = Path(__file__).resolve().parents[2]


def test_marks_are_written_only_when_a_file_is_named(tmp_path, monkeypatch):
    path = tmp_path / "marks.jsonl"
    monkeypatch.delenv(startup.ENV, raising=False)
    startup.mark("driver", "nothing asked")
    assert not path.exists()
    monkeypatch.setenv(startup.ENV, str(path))
    startup.mark("driver", "Ray up")
    startup.mark("engine", "engine loaded")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(m["role"], m["phase"]) for m in lines] == [("driver", "Ray up"), ("engine", "engine loaded")]
    assert all(m["process_start"] <= m["t"] for m in lines)


def test_the_benchmark_puts_each_process_start_before_its_marks(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from suite.against_trl.startup_cpu import phases

    marks = tmp_path / "marks.jsonl"
    rows = [
        {"t": 105.0, "process_start": 101.0, "pid": 2, "role": "engine", "phase": "engine loaded"},
        {"t": 103.0, "process_start": 100.0, "pid": 1, "role": "driver", "phase": "Ray up"},
        {"t": 104.0, "process_start": 101.0, "pid": 2, "role": "engine", "phase": "actor built (imports done)"},
    ]
    marks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = [(r["at_s"], r["pid"], r["phase"]) for r in phases(marks, t0=100.0)]
    assert got == [
        (0.0, 1, "process started"),
        (1.0, 2, "process started"),
        (3.0, 1, "Ray up"),
        (4.0, 2, "actor built (imports done)"),
        (5.0, 2, "engine loaded"),
    ]
