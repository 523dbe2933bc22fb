"""What pyproject.toml declares about the package, read once for the packaging tests: the
subpackages it lists, the folders they come from, and each extra's requirements."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


def pyproject() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config


def listed_packages() -> set[str]:
    return set(pyproject()["tool"]["setuptools"]["packages"])


def package_folders() -> dict[str, Path]:
    """Import name -> folder, for every folder under a mapped top-level folder that holds
    Python files (with or without an ``__init__.py``: a folder without one would be an
    implicit namespace package that setuptools' list leaves out just the same)."""
    found: dict[str, Path] = {}
    for package, folder in pyproject()["tool"]["setuptools"]["package-dir"].items():
        top = ROOT / folder
        for source in top.rglob("*.py"):
            relative = source.parent.relative_to(top)
            if "__pycache__" in relative.parts:
                continue
            found[".".join([package, *relative.parts])] = source.parent
    return found


def requirement_names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirement strings, normalised (PEP 503)."""
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(re.sub(r"[-_.]+", "-", match.group(0)).lower())
    return names


def extra(name: str) -> set[str]:
    return requirement_names(pyproject()["project"]["optional-dependencies"][name])


def base() -> set[str]:
    return requirement_names(pyproject()["project"]["dependencies"])
