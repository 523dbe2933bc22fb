"""The demo's training program (``rallypoint.worker.demo_train``) with the timestamps of a
process's way into training printed as ``phase`` lines: what ``bench/rejoin_phases.py``
reads of a replacement.

    python bench/rejoin_worker.py --endpoints A,B,C --job J --name N --checkpoint-dir DIR ...

Phases, each printed once, when it ends: ``interpreter`` (this file starts running),
``torch`` (``import torch``), ``imports`` (the elastic package and the demo's program),
``model`` (model, optimizer and sampler made), ``connect`` (the run's client made),
``session`` (the client's session opened) and ``join`` (the Join answered). The elastic
loop's own events (``joined``, ``round_formed``, ``trained``) and the demo's ``step`` lines
follow as the demo prints them.

The client has no events for its connection, its session and its Join, so this program wraps
the public methods that perform them (``Client.connect``, ``SessionKeeper.ensure``,
``Client.join``) to note when they return. The wrapping is for measuring only: it changes no
argument and no result.
"""

import time

STARTED_T = time.time()

import json  # noqa: E402  (after the clock: the interpreter's own start is a phase)
import sys  # noqa: E402
from typing import Any  # noqa: E402

_NAME = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--name=")), "?")


def mark(phase: str, t: float | None = None) -> None:
    line = {"event": "phase", "phase": phase, "t": time.time() if t is None else t}
    print(json.dumps({**line, "name": _NAME}), flush=True)


mark("interpreter", STARTED_T)
import torch  # noqa: E402

mark("torch")
from rallypoint.client import aio, session  # noqa: E402
from rallypoint.worker import demo_train  # noqa: E402

mark("imports")


def _instrument() -> None:
    """Note the client connected, the first session opened and the first Join answered
    (see the docstring)."""
    connect, ensure, join = aio.Client.connect, session.SessionKeeper.ensure, aio.Client.join
    noted: set[str] = set()

    async def timed_connect(self: aio.Client) -> aio.Client:
        result = await connect(self)
        mark("connect")
        return result

    async def timed_ensure(self: session.SessionKeeper, *args: Any, **kwargs: Any) -> Any:
        result = await ensure(self, *args, **kwargs)
        if "session" not in noted:
            noted.add("session")
            mark("session")
        return result

    async def timed_join(self: aio.Client, *args: Any, **kwargs: Any) -> Any:
        result = await join(self, *args, **kwargs)
        if "join" not in noted:
            noted.add("join")
            mark("join")
        return result

    aio.Client.connect = timed_connect  # type: ignore[method-assign]
    session.SessionKeeper.ensure = timed_ensure  # type: ignore[method-assign]
    aio.Client.join = timed_join  # type: ignore[method-assign]


def main() -> None:
    _instrument()
    args = demo_train.parse_args()
    torch.set_num_threads(1)
    state = demo_train.make_state()
    mark("model")

    with demo_train.open_run(args, state) as run:
        demo_train.train(
            run, checkpoint_every=args.checkpoint_every, step_sleep_s=args.step_sleep_s
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
