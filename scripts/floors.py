"""Prints a pip constraints file that holds every declared dependency of the package (and of the extras named on
the command line) at its floor: ``name>=X`` becomes ``name==X``. ``scripts/package_check.sh`` installs the wheel
under it, so a floor below what the code imports fails there, not on a user's machine."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

FLOOR = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(?:>=|==)\s*([0-9][^,;\s]*)")


def floors(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    pins = []
    for requirement in requirements:
        match = FLOOR.match(requirement)
        if match is None:
            raise SystemExit(f"{pyproject}: {requirement!r} declares no floor (name>=X)")
        pins.append(f"{match.group(1)}=={match.group(3)}")
    return pins


if __name__ == "__main__":
    print("\n".join(floors(Path(__file__).resolve().parents[1] / "pyproject.toml", sys.argv[1:])))
