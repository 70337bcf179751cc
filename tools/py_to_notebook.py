"""Build a notebook (no outputs) from a percent-format script.

    python tools/py_to_notebook.py src.py notebooks/01_benchmarking_script.ipynb

Cells start with `# %%` (code) or `# %% [markdown]` (markdown; lines lose their leading `# `).
`# %% tags=["parameters"]` marks papermill's parameters cell.
"""

import json
import re
import sys

import nbformat


def convert(src: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for chunk in re.split(r"^(?=# %%)", src, flags=re.M):
        if not chunk.strip():
            continue
        header, _, body = chunk.partition("\n")
        body = body.strip("\n")
        if "[markdown]" in header:
            text = "\n".join(re.sub(r"^# ?", "", line) for line in body.splitlines())
            nb.cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            cell = nbformat.v4.new_code_cell(body)
            m = re.search(r"tags=(\[.*\])", header)
            if m:
                cell.metadata["tags"] = json.loads(m.group(1))
            nb.cells.append(cell)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:03d}"
    return nb


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    nbformat.write(convert(open(src).read()), dst)
    print(f"wrote {dst}")
