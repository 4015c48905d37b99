"""The README stays a five-minute read that works: short, its sections in order, every relative link (its own and
the docs pages') pointing at a file that exists, every docs page linked from it, and every command it shows one the
project still has: `agentrl-ray` commands parse and their configs and overrides load, the files they name exist,
`make` targets are the Makefile's, and the Python API excerpt is the example script's, in order."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from agentrl_ray.cli import _parser, _split
from agentrl_ray.infra.profiles import load_config

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 175  # was 436 lines; a five-minute read (the real-model section added 17)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
# Commands whose config file and overrides the test loads (the others take run folders or options only).
CONFIG_COMMANDS = {"train", "config", "plan", "doctor"}


def _prose(text: str) -> str:
    """The text without its code blocks and inline code, where a bracket is not a link."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _relative_links(path: Path) -> list[str]:
    targets = [m.group(1) for m in LINK.finditer(_prose(path.read_text()))]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def _exists(folder: Path, target: str) -> bool:
    return (folder / target).is_dir() if target.endswith("/") else (folder / target).is_file()


def _blocks(lang: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(README.read_text()) if m.group(1) == lang]


def _commands() -> list[list[str]]:
    """Each command line of the README's bash blocks, continuations joined, comments dropped, split like a shell."""
    lines = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(words)
    return lines


def _agentrl_commands() -> list[list[str]]:
    return [words[words.index("agentrl-ray") + 1 :] for words in _commands() if "agentrl-ray" in words]


def _headings() -> list[str]:
    return [line for line in _prose(README.read_text()).splitlines() if line.startswith("## ")]


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines: move detail to a page under docs/"


def test_train_a_real_model_comes_right_after_two_commands():
    headings = _headings()
    assert "## Two commands" in headings and "## Train a real model" in headings
    assert headings[headings.index("## Two commands") + 1] == "## Train a real model", headings


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_existing_files(path):
    # A link ending in "/" names a folder (a results folder of benchmarks.md), any other a file.
    broken = [t for t in _relative_links(path) if not _exists(path.parent, t.split("#")[0])]
    assert not broken, f"{path.relative_to(ROOT)} links to missing files: {broken}"


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in _relative_links(README)}
    missing = [p.name for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs pages the README's Docs list does not link: {missing}"


def test_readme_agentrl_commands_parse_and_their_configs_load():
    commands = _agentrl_commands()
    shown = {args[0] for args in commands}
    assert {"train", "doctor", "config", "eval", "chat", "export", "view"} <= shown, shown
    parser = _parser()
    for args in commands:
        parsed, extra = parser.parse_known_args(args)
        assert not extra, (args, extra)
        if args[0] in CONFIG_COMMANDS:
            path, overrides = _split(parsed.args)
            if path is not None:
                assert (ROOT / path).is_file(), args
            load_config(ROOT / path if path else None, overrides)


def test_readme_files_and_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    text = README.read_text()
    for target in re.findall(r"`make ([\w-]+)`", text) + [w[1] for w in _commands() if w[0] == "make"]:
        assert target in targets, f"make {target}"
    # Files the commands name in this repository (the AWS template's output, agentrl-aws.yaml, is written by setup.sh).
    named = {w for words in _commands() for w in words if re.match(r"^(examples|clusters|tests)/", w)}
    named |= set(re.findall(r"`((?:examples|clusters)/[\w./-]+)`", text))
    missing = [p for p in sorted(named) if not (ROOT / p).exists()]
    assert not missing, missing


def test_readme_python_api_is_an_excerpt_of_the_example():
    """The README's Python block parses, and its lines (but `...` elisions) are the example script's, in order."""
    (block,) = _blocks("python")
    ast.parse(block)
    script = iter((ROOT / "examples" / "python_api" / "train.py").read_text().splitlines())
    for line in block.splitlines():
        if line.strip() and not line.strip().startswith("..."):
            assert any(line == s for s in script), f"not in examples/python_api/train.py (or out of order): {line}"
