"""environment.yml and pyproject.toml must list the same dependencies; the library alone stays light
(the notebook tooling, JupyterLab and transformers are extras), and `make setup` installs every extra."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Installed only through an extra: `pip install .` must not pull any of them.
EXTRAS_ONLY = {"papermill", "nbconvert", "nbformat", "ipykernel", "jupytext", "jupyterlab", "transformers", "ruff"}


def _normalise(requirement: str) -> str:
    return requirement.replace(" ", "").lower()


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def _requirements() -> list[str]:
    """The core dependencies and every extra's, less the extras' references to other extras."""
    extras = [r for reqs in PROJECT["optional-dependencies"].values() for r in reqs if _name(r) != PROJECT["name"]]
    return PROJECT["dependencies"] + extras


def test_environment_yml_mirrors_pyproject():
    wanted = {_normalise(r) for r in _requirements()}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_normalise(r) for r in pip_section if not r.startswith("-e")}
    assert listed == wanted, f"only in pyproject: {wanted - listed}; only in environment.yml: {listed - wanted}"
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert re.match(r"python=3\.1[1-9]", python)


def test_the_library_alone_pulls_no_notebook_tooling_or_transformers():
    assert not {_name(r) for r in PROJECT["dependencies"]} & EXTRAS_ONLY
    assert {_name(r) for r in _requirements()} >= EXTRAS_ONLY  # each is in some extra


def test_make_setup_installs_every_extra_and_the_wheelhouse_covers_the_notebooks_and_llama():
    makefile = (ROOT / "Makefile").read_text()
    installed = re.search(r'pip install .*-e "\.\[([a-z,]+)\]"', makefile)
    assert installed and set(installed.group(1).split(",")) == set(PROJECT["optional-dependencies"])
    offline = set(re.search(r"^OFFLINE_PACKAGES\s*:?=(.*)$", makefile, re.M).group(1).split())
    extras = PROJECT["optional-dependencies"]
    wanted = {_name(r) for r in extras["report"] + extras["llama"]} | {"ninja"}
    assert wanted <= offline, f"make wheelhouse misses {wanted - offline}"


def test_the_library_imports_without_the_extras():
    """Every module but the report's writeup (nbformat) imports with the extras' packages unimportable, and
    the report runner says which extra to install."""
    script = f"""
import importlib, importlib.abc, pkgutil, sys
BLOCKED = {sorted(EXTRAS_ONLY | {"IPython", "jupyter_client"})!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocker())
import importlib.util
_real_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in BLOCKED else _real_find_spec(name, *a)
import cs336_systems
failed = []
for m in pkgutil.walk_packages(cs336_systems.__path__, "cs336_systems."):
    if m.name.endswith("__main__"):
        continue  # running it is the point of it
    try:
        importlib.import_module(m.name)
    except ImportError as err:
        failed.append(m.name)
print("needs an extra:", failed)
from cs336_systems.benchmarking.llama_reference import llama_config
try:
    llama_config(None)
except ImportError as err:
    print(err)
from cs336_systems.report.run import main
sys.exit(main(["--profile", "cpu"]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "lib"), "TRITON_INTERPRET": "1"},
    )
    assert "needs an extra: ['cs336_systems.report.writeup']" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "the Llama reference needs the 'transformers' package" in done.stdout and ".[llama]" in done.stdout
    assert done.returncode == 2
    assert "error: the report needs papermill, nbconvert, nbformat, ipykernel, which are not installed" in done.stderr
    assert ".[report]" in done.stderr
