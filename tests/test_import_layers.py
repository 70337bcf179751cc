"""tools/import_layers.py: the library follows its import rules (no cycle, no private name across modules,
the core never importing the experiments, the layers of the kernels), the check names each kind of
violation when one is seeded into a small package or into a copy of the library, and docs/architecture.md's
generated tables are what the imports say."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "import_layers.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("import_layers", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


layers = load_tool()


def test_the_library_follows_its_import_rules():
    package = layers.read_package(layers.LIBRARY)
    assert layers.violations(package, layers.library_rules()) == []


def test_architecture_tables_are_the_imports():
    generated = layers.generated_docs(layers.read_package(layers.LIBRARY), layers.library_rules())
    assert generated in layers.ARCHITECTURE.read_text(), (
        "docs/architecture.md's generated tables differ from the imports: "
        "run python tools/import_layers.py --write-docs"
    )


# A package with every kind of module the rules know: kernels, their launch and API in a layered package,
# a helper with a private function, the experiments above them all, and an import made inside a function.
RULES = layers.Rules(
    layers=(
        layers.Layer("kernels", ("pkg.ops.kernel",)),
        layers.Layer("launch", ("pkg.ops.launch",)),
        layers.Layer("api", ("pkg.ops", "pkg.ops.api")),
    ),
    layered_packages=("pkg.ops",),
    experiments="pkg.experiments",
)
CLEAN = {
    "pkg/__init__.py": "",
    "pkg/helpers.py": '"""Small helpers."""\n\n\ndef _hidden():\n    pass\n\n\ndef shown():\n    _hidden()\n',
    "pkg/report.py": (
        '"""Writes the report. More."""\n\n\ndef write():\n    from pkg import helpers\n\n    helpers.shown()\n'
    ),
    "pkg/ops/__init__.py": '"""Operators."""\n\nfrom pkg.ops.api import attend\n',
    "pkg/ops/kernel.py": "def kernel():\n    pass\n",
    "pkg/ops/launch.py": "from pkg.ops import kernel\n\n\ndef launch():\n    kernel.kernel()\n",
    "pkg/ops/api.py": "from .launch import launch\n\n\ndef attend():\n    launch()\n",
    "pkg/experiments/__init__.py": "",
    "pkg/experiments/bench.py": "from pkg import helpers\nfrom pkg.ops import attend\n",
}
# name: (files written over the clean package, None removing one; a line the check must print)
SEEDS = {
    "cycle through a function": (
        {"pkg/a.py": "from pkg import b\n\nx = 1\n", "pkg/b.py": "def f():\n    from pkg.a import x\n"},
        "cycle: pkg.a -> pkg.b",
    ),
    "private name imported": (
        {"pkg/user.py": "from pkg.helpers import _hidden\n"},
        "private: pkg.user:1 imports pkg.helpers._hidden",
    ),
    "private name read": (
        {"pkg/user.py": "from pkg import helpers\n\nhelpers._hidden()\n"},
        "private: pkg.user:3 uses pkg.helpers._hidden",
    ),
    "core imports the experiments": (
        {"pkg/user.py": "def f():\n    from pkg.experiments.bench import attend\n"},
        "experiments: pkg.user:2 imports pkg.experiments.bench",
    ),
    "import of a higher layer": (
        {"pkg/ops/launch.py": "from pkg.ops import api, kernel\n"},
        "layer: pkg.ops.launch:1 (launch) imports pkg.ops.api (api), a higher layer",
    ),
    "kernel imports outside its layer": (
        {"pkg/ops/kernel.py": "from pkg import helpers\n"},
        "layer: pkg.ops.kernel:1 (kernels) imports pkg.helpers, outside its layer",
    ),
    "module of no layer": ({"pkg/ops/new.py": ""}, "layer: pkg.ops.new has no layer"),
    "layer of no module": ({"pkg/ops/launch.py": None}, "layer: no module is in the layer 'launch'"),
}


def write_package(root: Path, files: dict[str, str | None]) -> Path:
    for name, text in files.items():
        path = root / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root / "pkg"


def test_a_package_that_follows_the_rules_has_no_violation(tmp_path):
    package = layers.read_package(write_package(tmp_path, CLEAN))
    assert layers.violations(package, RULES) == []
    table = layers.dependency_table(package)
    assert "| `report` | Writes the report. | *`helpers`* | — |" in table  # an import inside a function
    assert "| `experiments/` | — | `helpers`, `ops/` | — |" in table
    assert "| launch | `ops.launch` |" in layers.layer_table(package, RULES)


@pytest.mark.parametrize("seed", SEEDS, ids=list(SEEDS))
def test_the_check_names_a_seeded_violation(tmp_path, seed):
    files, expected = SEEDS[seed]
    write_package(tmp_path, CLEAN)
    package = layers.read_package(write_package(tmp_path, files))
    found = layers.violations(package, RULES)
    assert any(line.startswith(expected) for line in found), found


def test_the_command_fails_on_a_copy_of_the_library_with_a_kernel_importing_the_api(tmp_path):
    copy = tmp_path / "cs336_systems"
    shutil.copytree(layers.LIBRARY, copy, ignore=shutil.ignore_patterns("__pycache__"))
    package, rules = layers.read_package(copy), layers.library_rules()
    in_layer = {i: sorted(m for m in package.files if layers.layer_of(m, rules) == i) for i in range(len(rules.layers))}
    kernel, api = in_layer[0][0], in_layer[len(rules.layers) - 1][-1]
    path = package.files[kernel]
    line = len(path.read_text().splitlines()) + 1
    path.write_text(path.read_text() + f"import {api}\n")
    done = subprocess.run([sys.executable, str(TOOL), str(copy)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"layer: {kernel}:{line} (kernels) imports {api} (api), a higher layer" in done.stdout
