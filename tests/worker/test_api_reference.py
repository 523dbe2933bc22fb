"""docs/api.md, the reference of ``elastic_training``, its events, rounds and TrainState, is
generated from worker/elastic/ and kept true: fresh, every argument described, every
event the code emits described with exactly the fields it carries. And ``on_event`` with the
wrong signature is refused when the run is made, not at the worker's join."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from rallypoint.worker import elastic
from rallypoint.worker.elastic import ElasticRound, ElasticRun, Formation, TrainState

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_fresh() -> None:
    docs = generator()
    assert docs.PAGE.read_text() == docs.render(), "run `.venv/bin/python docs/generate.py`"


def test_every_argument_is_described_and_nothing_else() -> None:
    described = generator().sections(ElasticRun.__doc__)["arguments"]
    parameters = list(inspect.signature(ElasticRun.__init__).parameters)[1:]
    assert list(described) == parameters
    assert all(text.strip() for text in described.values())


def emitted_events() -> dict[str, set[str]]:
    """kind -> field names of every ``emit("kind", ...)`` in worker/elastic/, following
    ``**fields`` to the dict literal the same function builds."""
    package = Path(elastic.__file__).parent
    trees = [ast.parse(module.read_text()) for module in sorted(package.glob("*.py"))]
    events: dict[str, set[str]] = {}
    for function in (node for tree in trees for node in ast.walk(tree)):
        if not isinstance(function, ast.FunctionDef):
            continue
        dicts = {
            target.id: {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(function):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "emit"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                continue
            fields = events.setdefault(str(node.args[0].value), set())
            for keyword in node.keywords:
                if keyword.arg is not None:
                    fields.add(keyword.arg)
                elif isinstance(keyword.value, ast.Name):
                    fields |= dicts[keyword.value.id]
    return events


def test_every_event_is_described_with_exactly_its_fields() -> None:
    docs = generator()
    described = {
        kind: set(docs.event_fields(text)[0])
        for kind, text in docs.sections(ElasticRun.__doc__)["events"].items()
    }
    emitted = emitted_events()
    assert "round_formed" in emitted and "checkpoint_committed" in emitted  # the walk works
    assert described == emitted


def assigned_in_init(cls: type[Any]) -> set[str]:
    source = inspect.getsource(cls.__init__)  # type: ignore[misc]
    tree = ast.parse(inspect.cleandoc("\n" + source) if source.startswith(" ") else source)
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


@pytest.mark.parametrize("cls", [ElasticRun, ElasticRound])
def test_every_attribute_described_exists(cls: type[Any]) -> None:
    described = generator().sections(cls.__doc__)["attributes"]
    assert described and set(described) <= assigned_in_init(cls)


@pytest.mark.parametrize("cls", [TrainState, Formation])
def test_every_field_is_described(cls: type[Any]) -> None:
    described = generator().sections(cls.__doc__)["attributes"]
    assert list(described) == list(cls.__dataclass_fields__)


@pytest.mark.parametrize("cls", [ElasticRun, ElasticRound])
def test_every_public_member_has_a_docstring(cls: type[Any]) -> None:
    for name, member in generator().public_members(cls):
        doc = member.fget.__doc__ if isinstance(member, property) else member.__doc__
        assert doc, f"{cls.__name__}.{name} has no docstring"


def make_run(**options: Any) -> ElasticRun:
    model = torch.nn.Linear(2, 1)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return ElasticRun(
        "127.0.0.1:2379",
        job="j",
        name="w",
        state=state,
        checkpoint_dir="ckpt",
        min_nodes=1,
        max_nodes=1,
        **options,
    )


def test_on_event_with_the_wrong_signature_is_refused_when_the_run_is_made() -> None:
    def one_argument(event: object) -> None:
        pass

    with pytest.raises(TypeError) as refused:
        make_run(on_event=one_argument)
    assert str(refused.value) == (
        "on_event is called as on_event(kind, fields): kind is the event's name (e.g. "
        "'round_formed'), fields a dict of its values; "
        "test_on_event_with_the_wrong_signature_is_refused_when_the_run_is_made.<locals>."
        "one_argument cannot take those two arguments (see docs/api.md, 'Events')"
    )
    with pytest.raises(TypeError, match="must be a callable"):
        make_run(on_event="print")


def test_on_event_callables_that_fit() -> None:
    heard: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def __call__(self, kind: str, fields: dict[str, Any], *more: object) -> None:
            heard.append((kind, fields))

    for handler in (lambda kind, fields: heard.append((kind, fields)), Recorder(), print):
        make_run(on_event=handler)
    run = make_run(on_event=lambda kind, fields: heard.append((kind, fields)))
    run.emit("joined", participant_id=7)
    assert heard[-1][0] == "joined"
    assert heard[-1][1]["participant_id"] == 7 and heard[-1][1]["name"] == "w"
