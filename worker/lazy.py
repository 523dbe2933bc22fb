"""Package names that load their module on first use (PEP 562's module ``__getattr__``).

A package lists each exported name with the submodule that defines it; importing the package
then loads none of them, and ``from package import name`` loads only ``name``'s module. The
worker package does so for torchrun's sake (its ``__init__`` says why), and the snapshots
package so that a job without memory snapshots, and a replacement before it joins, never
loads their machinery (worker/elastic/, "Imports").

:func:`dtensors` and :func:`any_dtensor` find DTensors without importing DTensor (which loads
torch.distributed.tensor, about a third of a second): a job whose model holds none need not.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def module_getattr(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``package`` (whose globals are ``namespace``) that imports
    ``exports[name]`` (a submodule's name) on first use and keeps the value."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    return __getattr__


def any_dtensor(values: Iterable[object]) -> bool:
    """Whether any of ``values`` is a ``torch.distributed.tensor.DTensor``. Exact without
    importing it: until the module defining the class is imported (by whoever made a
    DTensor: FSDP2, a device mesh's tensor parallelism, a DCP read), no value can be one."""
    dtensor = _dtensor_class()
    return dtensor is not None and any(isinstance(value, dtensor) for value in values)


def dtensors(values: Iterable[object]) -> list[DTensor]:
    """Those of ``values`` that are DTensors (see :func:`any_dtensor`)."""
    dtensor = _dtensor_class()
    return [] if dtensor is None else [value for value in values if isinstance(value, dtensor)]


def _dtensor_class() -> type[DTensor] | None:
    """DTensor's class if the module defining it was imported, else None."""
    return getattr(sys.modules.get("torch.distributed.tensor._api"), "DTensor", None)
