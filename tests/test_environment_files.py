"""environment.yml and pyproject.toml must list the same dependencies."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _normalise(requirement: str) -> str:
    return requirement.replace(" ", "").lower()


def test_environment_yml_mirrors_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_normalise(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_normalise(r) for r in pip_section if not r.startswith("-e")}
    assert listed == wanted, f"only in pyproject: {wanted - listed}; only in environment.yml: {listed - wanted}"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert re.match(r"python=3\.1[1-9]", python)
