"""Package names that load their module on first use (PEP 562's module ``__getattr__``).

A package lists each exported name with the submodule that defines it; importing the package
then loads none of them, and ``from package import name`` loads only ``name``'s module. The
worker package does so for torchrun's sake (its ``__init__`` says why), and the snapshots
package so that a job without memory snapshots, and a replacement before it joins, never
loads their machinery (worker/elastic/, "Imports").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


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
