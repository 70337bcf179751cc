"""The PDF writeup, printed by headless Chromium and checked page by page as rendered images.

Needs Chromium (the route `make pdf` takes) and poppler's pdftoppm / pdftotext to look at the
result; skipped where they are missing (`.ci/run` installs them where it can).
"""

import json
import shutil
import subprocess

import matplotlib.image as mpimg
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
    """A report folder whose 2025 writeup has a wide support table and a tall figure, the things page edges cut."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from cs336_systems.report.answers import Answer, record_answer
    from cs336_systems.report.deliverables import deliverables

    results = tmp_path / "results"
    (results / "figures").mkdir(parents=True)
    fig, ax = plt.subplots(figsize=(12, 9))
    ax.plot(np.arange(100), np.arange(100) ** 2)
    fig.savefig(results / "figures" / "tall.png", dpi=80)
    plt.close(fig)
    wide = pd.DataFrame([{f"column {i}": i * 1234.5 + 0.01 for i in range(14)}])
    first, second = deliverables("2025")[:2]
    record_answer(results, first.notebook, first.answer, Answer("A wide table follows.", table=wide))
    record_answer(results, second.notebook, second.answer, Answer("A tall figure follows.", figure="figures/tall.png"))
    notebooks = sorted({first.notebook, second.notebook})
    (tmp_path / "runs.json").write_text(json.dumps([dict(name=n, status="ok", seconds=1.0) for n in notebooks]))
    (tmp_path / "environment.json").write_text(
        json.dumps({"CPU": "test machine", "profile": "cpu", "commit": "abc1234"})
    )
    build_index(tmp_path, "cpu")
    return tmp_path / "writeup_2025.html"


def test_pdf_pages_render_with_title_and_no_blank_page(tmp_path):
    pdf = html_to_pdf(_report(tmp_path), tmp_path / "writeup.pdf")
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf), str(tmp_path / "page")], check=True)
    pages = sorted(tmp_path.glob("page-*.png"))
    assert len(pages) >= 2, f"expected the environment, the answers and the unanswered parts, got {len(pages)} pages"
    for page in pages:
        pixels = mpimg.imread(page)[..., :3]
        assert (pixels < 0.9).mean() > 0.002, f"{page.name} is blank"
    title = subprocess.run(
        ["pdftotext", "-f", "1", "-l", "1", str(pdf), "-"], capture_output=True, text=True, check=True
    ).stdout
    assert "Assignment 2" in title and "test machine" in title and "abc1234" in title
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert "16,048.5" in text or "16,049" in text, "the wide table's last column was cut at the page edge"


def test_figures_fit_the_page_width(tmp_path):
    pdf = html_to_pdf(_report(tmp_path), tmp_path / "writeup.pdf")
    subprocess.run(["pdftoppm", "-r", "40", "-png", str(pdf), str(tmp_path / "page")], check=True)
    for page in sorted(tmp_path.glob("page-*.png")):
        pixels = mpimg.imread(page)[..., :3]
        dark_columns = np.flatnonzero((pixels < 0.9).any(axis=(0, 2)))
        if len(dark_columns):
            # ink never touches the right edge: nothing runs off the page
            assert dark_columns.max() < pixels.shape[1] - 2, f"{page.name}: content reaches the right page edge"
