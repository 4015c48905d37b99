"""Every config field carries a one-line description (an attribute docstring), and `agentrl-ray config --help` shows
each key with its type, default and description."""

import dataclasses
import typing

from agentrl_ray import config
from agentrl_ray.cli import main
from agentrl_ray.config.help import describe, field_docs


def _config_classes():
    seen, todo = [], [config.Config]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        hints = typing.get_type_hints(cls)
        todo += [hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    return seen


def test_every_config_field_has_a_description():
    missing = [
        f"{cls.__name__}.{name}" for cls in _config_classes() for name, doc in field_docs(cls).items() if not doc
    ]
    assert not missing, f"config fields without an attribute docstring: {missing}"
    # field_docs sees every field (a field it missed would pass the check above unseen).
    for cls in _config_classes():
        assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}, cls.__name__


def test_config_help_lists_every_key(capsys):
    assert main(["config", "--help"]) == 0
    out = capsys.readouterr().out
    keys = describe()
    assert {k.key for k in keys} >= {"learner.lr", "echo.normalization", "learner.lora.r", "sync.bucket_mb"}
    for k in keys:
        assert f"  {k.key}: {k.type} = {k.default!r}" in out
    lr = next(k for k in keys if k.key == "learner.lr")
    assert lr.type == "float" and lr.default == 1e-4 and "learning rate" in lr.doc
