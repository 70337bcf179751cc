"""PDF export: headless Chromium prints the HTML writeup (page breaks and image sizes from the
writeup's print CSS), so no LaTeX installation is needed.

    python -m cs336_systems.report.pdf --profile cpu      # reports/cpu/writeup_*.html -> writeup_*.pdf
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cs336_systems.report.environment import repo_root, resolve_profile

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = (
    "no Chromium found (looked for {names}). Install one, e.g. `sudo apt-get install chromium` on Debian/Ubuntu, "
    "or set CHROMIUM=/path/to/chrome"
)


def find_chromium() -> str:
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        if not Path(explicit).exists():
            raise FileNotFoundError(f"CHROMIUM={explicit} does not exist")
        return explicit
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError(INSTALL_HINT.format(names=", ".join(CHROMIUM_NAMES)))


def html_to_pdf(html: Path, pdf: Path, timeout_s: float = 180) -> Path:
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="cs336_chromium_") as profile_dir:
        cmd = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile_dir}",
            "--no-pdf-header-footer",
            "--virtual-time-budget=15000",
            f"--print-to-pdf={pdf}",
            html.resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not pdf.exists() or pdf.stat().st_size == 0:
        raise RuntimeError(f"Chromium could not print {html} (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
    return pdf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336_systems.report.pdf", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="auto")
    p.add_argument("--out", default=None, help="report folder (default: reports/<profile>)")
    args = p.parse_args(argv)
    try:
        # A profile names a folder here: printing the gpu report needs no GPU.
        profile = args.profile if args.profile != "auto" else resolve_profile(None)
        folder = Path(args.out) if args.out else repo_root() / "reports" / profile
        pages = sorted(folder.glob("writeup_*.html"))
        if not pages:
            raise FileNotFoundError(f"{folder} has no writeup_*.html: run `make report` first")
        for html in pages:
            pdf = html_to_pdf(html, html.with_suffix(".pdf"))
            print(f"wrote {pdf}")
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
