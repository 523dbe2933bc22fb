"""The servicers' read-only state view: mypy rejects a mutation made through it.

"Only the apply path mutates the state" is checked by the type checker: a servicer gets the
state as a ``StateView``. These tests run mypy on small programs that use the view, as a
servicer would, and on programs that try to change the state through it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from mypy import api as mypy_api

_HEADER = """
from rallypoint.coordinator.node.api import ServerNode
from rallypoint.coordinator.state.commands import Put
from rallypoint.coordinator.state.jobs import JobState
from rallypoint.coordinator.state.view import StateView


def servicer(node: ServerNode) -> None:
    view: StateView = node.state
"""

_QUERIES = """
    view.get(b"k")
    view.range(b"", 10)
    view.lease_list()
    view.session_info(1)
    view.events_since(1, b"k")
    print(view.applied_index, view.revision, view.limits.max_key_bytes)
    job = view.rendezvous.jobs.get("j")
    if job is not None:
        print(job.round.number, job.state, len(job.participants), job.checkpoints.latest())
        store = view.rendezvous.member_store("j", 1, 2)
        print(store)
"""

_MUTATIONS = {
    "apply": "    view.apply(1, b'')",
    "restore": "    view.restore(b'')",
    "assign applied index": "    view.applied_index = 5",
    "reach the key store": "    view.kv.put(b'k', b'v', 1, 0)",
    "store into jobs": "    view.rendezvous.jobs['j'] = view.rendezvous.jobs['i']",
    "close a job": "    view.rendezvous.jobs['j'].closed = True",
    "drop participants": "    view.rendezvous.jobs['j'].participants.clear()",
    "write a round's store": (
        "    s = view.rendezvous.member_store('j', 1, 2)\n"
        "    if not isinstance(s, Exception):\n"
        "        s.execute(Put(b'k', b'v'), view.limits.rendezvous)"
    ),
    "end a job": "    view.rendezvous.jobs['j'].reopen()",
    "change the state through the node": "    node.state.apply(1, b'')",
}


def _program() -> tuple[str, dict[int, str]]:
    """One module: a servicer's queries, then each mutation in a function of its own; the
    line of each mutation's last statement, by name."""
    lines = (_HEADER + _QUERIES).splitlines()
    mutation_lines: dict[int, str] = {}
    for number, (name, body) in enumerate(_MUTATIONS.items()):
        lines += ["", "", f"def mutation_{number}(node: ServerNode) -> None:"]
        lines.append("    view: StateView = node.state")
        lines += body.splitlines()
        mutation_lines[len(lines)] = name
    return "\n".join(lines) + "\n", mutation_lines


def test_mypy_accepts_queries_and_rejects_each_mutation_through_the_view(
    tmp_path: Path,
) -> None:
    # A view of this checkout's import package, as the Makefile's .pkgview is.
    view = tmp_path / "view" / "rallypoint"
    view.mkdir(parents=True)
    for name in ("raft", "coordinator", "client", "worker", "proto"):
        package = importlib.import_module(f"rallypoint.{name}")
        (view / name).symlink_to(Path(package.__file__ or "").resolve().parent)
    source, mutation_lines = _program()
    program = tmp_path / "servicer.py"
    program.write_text(source)
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {tmp_path / 'view'}\nstrict = True\n")
    out, err, _ = mypy_api.run(
        [
            "--config-file",
            str(config),
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(program),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    lines_with_errors = {int(line.split(":")[1]) for line in errors}
    assert not err, err
    queries_end = len((_HEADER + _QUERIES).splitlines())
    assert not [line for line in errors if int(line.split(":")[1]) <= queries_end], out
    missed = [name for line, name in mutation_lines.items() if line not in lines_with_errors]
    assert not missed, f"mypy accepted mutations through the view: {missed}\n{out}"
