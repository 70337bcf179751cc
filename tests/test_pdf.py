"""The PDF writeup, printed by headless Chromium and checked page by page as rendered images.

Needs Chromium (the route `make pdf` takes) and poppler's pdftoppm / pdftotext to look at the
result; skipped where they are missing (`.ci/run` installs them where it can).
"""

import json
import shutil
import subprocess

import matplotlib.image as mpimg
import nbformat
import numpy as np
import pytest

from cs336_systems.report.pdf import find_chromium, html_to_pdf
from cs336_systems.report.run import build_index


def _have_chromium() -> bool:
    try:
        find_chromium()
        return True
    except FileNotFoundError:
        return False


pytestmark = pytest.mark.skipif(
    not (_have_chromium() and shutil.which("pdftoppm") and shutil.which("pdftotext")),
    reason="needs Chromium and poppler-utils (pdftoppm, pdftotext)",
)


def _report(tmp_path):
    """A two-notebook report folder: a wide table and a tall figure, the things page edges cut."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 9))
    ax.plot(np.arange(100), np.arange(100) ** 2)
    png = tmp_path / "figure.png"
    fig.savefig(png, dpi=80)
    plt.close(fig)
    import base64

    wide = "| " + " | ".join(f"column {i}" for i in range(14)) + " |\n|" + "---|" * 14 + "\n" + "| " + " | ".join(
        f"{i * 1234.5:,.1f}" for i in range(14)) + " |\n"
    for name, outputs in (
        ("01_table", [nbformat.v4.new_output("display_data", data={"text/markdown": wide})]),
        ("02_figure", [nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png.read_bytes()).decode()})]),
    ):
        cell = nbformat.v4.new_code_cell("show()")
        cell.outputs = outputs
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}"), cell])
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    (tmp_path / "runs.json").write_text(json.dumps([dict(name=n, status="ok", seconds=1.0) for n in ("01_table", "02_figure")]))
    (tmp_path / "environment.json").write_text(json.dumps({"CPU": "test machine", "profile": "cpu", "commit": "abc1234"}))
    build_index(tmp_path, "cpu")
    return tmp_path / "writeup.html"


def test_pdf_pages_render_with_title_and_no_blank_page(tmp_path):
    pdf = html_to_pdf(_report(tmp_path), tmp_path / "writeup.pdf")
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf), str(tmp_path / "page")], check=True)
    pages = sorted(tmp_path.glob("page-*.png"))
    # title page, then each notebook section starts a page
    assert len(pages) >= 3, f"expected a title page and one page per section, got {len(pages)} pages"
    for page in pages:
        pixels = mpimg.imread(page)[..., :3]
        assert (pixels < 0.9).mean() > 0.002, f"{page.name} is blank"
    title = subprocess.run(["pdftotext", "-f", "1", "-l", "1", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "CS336 Assignment 2" in title and "test machine" in title and "abc1234" in title
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "16,048.5" in text, "the wide table's last column was cut at the page edge"


def test_figures_fit_the_page_width(tmp_path):
    pdf = html_to_pdf(_report(tmp_path), tmp_path / "writeup.pdf")
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf), str(tmp_path / "page")], check=True)
    for page in sorted(tmp_path.glob("page-*.png")):
        pixels = mpimg.imread(page)[..., :3]
        dark_columns = np.flatnonzero((pixels < 0.9).any(axis=(0, 2)))
        if len(dark_columns):
            # ink never touches the right edge: nothing runs off the page
            assert dark_columns.max() < pixels.shape[1] - 2, f"{page.name}: content reaches the right page edge"
