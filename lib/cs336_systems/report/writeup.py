"""The writeups: one per handout, each deliverable in the handout's order, its answer first.

    writeup_2025.html, writeup_2026.html   (writeup_*.pdf printed from them by `report.pdf`)

Each opens with the environment once (the machines, software, and the commit and date of every
notebook's run), then every problem of the handout with its points, and under it every lettered
sub-part: what is asked (in a line), the answer the notebooks recorded (`ctx.answer`, see
`report.answers`), then the one table or figure behind it and a link to the notebook's own HTML,
where the sweeps, timelines and listings stay. A deliverable without an answer appears in place with
the reason (not run on this machine, the notebook failed or has not run here). Known problems of the
committed results (`caveats.json`, kept by hand) close the document.

`coverage` tells which deliverables have no answer; `jargon` finds the project's internal words and
debug output that a writeup must not show (the runner and the tests check both).
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

from nbconvert.filters.markdown_mistune import markdown2html_mistune

from cs336_systems.report.answers import load_answers, support_table
from cs336_systems.report.deliverables import HANDOUT_TITLES, PROBLEM_POINTS, Deliverable, deliverables
from cs336_systems.report.files import read_json

HANDOUTS = ("2026", "2025")

PRINT_CSS = """
@page { size: A4; margin: 14mm 13mm; }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 52rem; margin: 1.5rem auto; \
line-height: 1.45;
       font-size: 11pt; color: #111; padding: 0 1rem; }
h1 { font-size: 1.6em; margin-bottom: .2em; } \
h2 { font-size: 1.25em; margin: 1.6em 0 .4em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.0em; margin: 1.1em 0 .2em; } .asks { color: #555; font-style: italic; margin: 0 0 .3em; }
.answer p { margin: .3em 0; } .caveat { color: #6a4a00; font-size: .92em; } .unanswered { color: #a00; }
.details { font-size: .85em; color: #555; } img { max-width: 100%; height: auto; break-inside: avoid; }
table { border-collapse: collapse; font-size: .8em; margin: .4em 0; break-inside: avoid; }
td, th { border-bottom: 1px solid #ddd; padding: 2px 6px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.env td, .env th { text-align: left; } .deliverable { break-inside: avoid-page; }
code { font-size: .92em; }
"""


@dataclass(frozen=True)
class Status:
    """What a report folder holds for one deliverable."""

    deliverable: Deliverable
    record: dict | None  # the recorded answer, None when there is none
    reason: str = ""  # why there is no answer (empty when answered)

    @property
    def answered(self) -> bool:
        return self.record is not None and not self.record.get("reason")

    @property
    def missing(self) -> bool:
        """The notebook that answers it ran to the end here and recorded nothing: a gap in the notebooks."""
        return self.record is None and self.reason.startswith("no answer")


def deliverable_status(report_dir: Path, runs: list[dict], handout: str) -> list[Status]:
    answers = load_answers(Path(report_dir) / "results")
    run_of = {r["name"]: r for r in runs}
    out = []
    for d in deliverables(handout):
        record = answers.get(d.answer)
        run = run_of.get(d.notebook)
        if record is not None:
            out.append(Status(d, record, record.get("reason", "")))
        elif run is None:
            out.append(Status(d, None, f"notebook {d.notebook} has not run in this report"))
        elif run.get("status") != "ok":
            out.append(
                Status(d, None, f"notebook {d.notebook} failed here: {(run.get('error') or '').splitlines()[0:1]}")
            )
        else:
            out.append(Status(d, None, f"no answer recorded by {d.notebook}"))
    return out


def coverage(report_dir: Path, runs: list[dict]) -> dict[str, list[Status]]:
    """Per handout, the deliverables whose notebook ran here but recorded no answer."""
    return {h: [s for s in deliverable_status(report_dir, runs, h) if s.missing] for h in HANDOUTS}


# What a grader must not meet in a writeup: the project's own targets and version tags, and artefacts of
# the code (object reprs, warnings). Commit hashes are allowed in the environment block only.
JARGON = {
    "project target words": re.compile(
        r"\bmoonshots?\b|\b(?:the|our|its|a|every) (?:issue's )?bars?\b(?! (?:chart|plot|graph))|\bbars?:|"
        r"\bissue(?:'s| #?\d+)",
        re.I,
    ),
    "kernel version tags": re.compile(r"(?<![\w.])v\d+(?:\.\d+)?\b"),
    "pass/fail verdicts": re.compile(r"\b(?:PASS|FAIL)(?:ED|ES)?\b"),
    "object reprs": re.compile(r"PosixPath\(|<\w+(?:\.\w+)+ object at 0x|\bdtype\('"),
    "Python warnings": re.compile(r"\b\w*Warning:|Triggered internally at"),
    "configuration constants": re.compile(r"\b[a-z_]+\.[A-Z][A-Z_]{3,}\b"),
    "unrendered LaTeX (a writeup has no math renderer)": re.compile(r"\$[^$\s][^$]*\$|\\(?:frac|sqrt|mathrm|tau)\b"),
}
COMMIT = re.compile(r"(?<![\w/.-])[0-9a-f]{7,40}(?![\w-])")


def jargon(text: str, allow_commits: bool = False) -> list[str]:
    """The internal words and artefacts found in `text`, as 'kind: match' strings."""
    found = [f"{kind}: {m.group(0)}" for kind, rx in JARGON.items() for m in rx.finditer(text)]
    if not allow_commits:
        found += [
            f"commit hash: {m.group(0)}"
            for m in COMMIT.finditer(text)
            if re.search(r"[a-f]", m.group(0)) and re.search(r"\d", m.group(0))
        ]
    return found


def writeup_text(page: str) -> str:
    """The words of a writeup's HTML a reader sees outside the environment block (no tags, no images)."""
    page = re.sub(r"<img[^>]*>", " ", page)
    page = re.sub(r"<style>.*?</style>", " ", page, flags=re.S)
    page = re.sub(r"<h2>Environment</h2>.*?(?=<h2)", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def _markdown(text: str) -> str:
    return markdown2html_mistune(text)


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "–"
        if v in (float("inf"), float("-inf")):
            return "∞" if v > 0 else "−∞"
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _table_html(df) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
        for row in df.itertuples(index=False)
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _figure_html(results: Path, figure: str) -> str:
    path = results / figure
    if not path.exists():
        return f"<p class='unanswered'>(figure {html.escape(figure)} is missing from this report)</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<img alt='{html.escape(figure)}' src='data:image/png;base64,{data}'>"


def _part_html(status: Status, results: Path, heading: str = "") -> str:
    """One deliverable as a block the printer keeps on one page where it fits; `heading` (a problem's title)
    goes inside the block of its first part, so a title never ends a page alone."""
    d = status.deliverable
    title = f"({d.part})" if d.part else "Deliverable"
    points = f" · {d.points:g} pt" if d.points else ""
    parts = [
        f"<div class='deliverable' id='{html.escape(d.id)}'>{heading}<h3>{title}{points}</h3>",
        f"<p class='asks'>{html.escape(d.asks)}</p>",
    ]
    record = status.record
    if status.answered:
        parts.append(f"<div class='answer'>{_markdown(record['text'])}</div>")
        table = support_table(results, record)
        if table is not None:
            parts.append(_table_html(table))
        if record.get("figure"):
            parts.append(_figure_html(results, record["figure"]))
        if record.get("caveat"):
            parts.append(f"<div class='caveat'>{_markdown(record['caveat'])}</div>")
    else:
        parts.append(f"<p class='unanswered'><b>Not answered in this report:</b> {html.escape(status.reason)}.</p>")
    parts.append(f"<p class='details'>Details: <a href='{d.notebook}.html'>{d.notebook}</a></p></div>")
    return "".join(parts)


def _environment_html(env: dict[str, str], runs: list[dict]) -> str:
    keep = ("GPU", "driver", "CUDA (torch build)", "CPU", "torch", "triton", "python", "profile", "commit", "date")
    env_rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(env[k]))}</td></tr>" for k in keep if env.get(k)
    )
    run_rows = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{html.escape(r.get('machine', ''))}</td>"
        f"<td>{html.escape(r.get('commit', ''))}</td><td>{html.escape(r.get('date', ''))}</td>"
        f"<td>{html.escape(r.get('status', ''))}</td></tr>"
        for r in sorted(runs, key=lambda r: r["name"])
    )
    return (
        f"<h2>Environment</h2><table class='env'>{env_rows}</table>"
        "<p>Each notebook's run (the machine, commit and date its answers come from):</p>"
        f"<table class='env'><tr><th>notebook</th><th>machine</th><th>commit</th><th>date</th><th>status</th></tr>"
        f"{run_rows}</table>"
    )


def _caveats_html(caveats: list[dict]) -> str:
    if not caveats:
        return ""
    items = "".join(f"<li><b>{html.escape(c['notebook'])}</b>: {_markdown(c['caveat'])}</li>" for c in caveats)
    return f"<h2>Known problems of these results</h2><ul>{items}</ul>"


def build_handout_writeup(
    report_dir: Path, env: dict[str, str], runs: list[dict], handout: str, caveats: list[dict] = ()
) -> Path:
    """writeup_<handout>.html of a report folder."""
    report_dir = Path(report_dir)
    results = report_dir / "results"
    statuses = deliverable_status(report_dir, runs, handout)
    answered = sum(s.answered for s in statuses)
    body = [
        f"<h1>{html.escape(HANDOUT_TITLES[handout])}</h1>",
        f"<p>Answers regenerated from measurements by <code>make report</code> ({html.escape(env.get('profile', '?'))} "
        f"profile): {answered} of {len(statuses)} deliverables answered here; each names the notebook whose "
        "HTML holds the full sweeps, timelines and code.</p>",
        _environment_html(env, runs),
    ]
    problem = None
    for s in statuses:
        heading = ""
        if s.deliverable.problem != problem:
            problem = s.deliverable.problem
            points = PROBLEM_POINTS.get(handout, {}).get(problem)
            heading = (
                f"<h2 id='{html.escape(problem)}'>Problem <code>{html.escape(problem)}</code>"
                + (f" ({points:g} points)" if points else "")
                + "</h2>"
            )
        body.append(_part_html(s, results, heading))
    body.append(_caveats_html(list(caveats)))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(HANDOUT_TITLES[handout])} — report</title><style>{PRINT_CSS}</style></head><body>"
        + "".join(body)
        + "</body></html>"
    )
    out = report_dir / f"writeup_{handout}.html"
    out.write_text(page, encoding="utf-8")
    return out


def _load_json(path: Path) -> list[dict]:
    return read_json(path, "fix or delete it") if path.exists() else []


def build_writeup(report_dir: Path, env: dict[str, str], runs: list[dict] = ()) -> list[Path]:
    """Both handouts' writeups and the folder's README.md."""
    report_dir = Path(report_dir)
    results = report_dir / "results"
    caveats = _load_json(report_dir / "caveats.json")
    outs = [build_handout_writeup(report_dir, env, list(runs), h, caveats) for h in HANDOUTS]
    headlines = sorted(_load_json(results / "headlines.json"), key=lambda h: h["notebook"])
    not_run = sorted(_load_json(results / "not_run.json"), key=lambda h: h["notebook"])
    write_summary(report_dir, env, headlines, not_run, caveats, list(runs))
    return outs


def _markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    if not rows:
        return "_none_\n"
    head = "| " + " | ".join(title for _, title in columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join(
        "| " + " | ".join(_fmt(r.get(key, "")).replace("|", "\\|") for key, _ in columns) + " |\n" for r in rows
    )
    return head + body


def write_summary(
    report_dir: Path,
    env: dict[str, str],
    headlines: list[dict],
    not_run: list[dict],
    caveats: list[dict],
    runs: list[dict],
) -> Path:
    """README.md of a report folder: where each notebook ran and the headline numbers, from the run's data.

    What the project README points to for results, so no measured number is typed by hand."""
    lines = [
        f"# Results of the `{env.get('profile', '?')}` report",
        "",
        "Generated by `python -m cs336_systems.report.run` from this folder's `runs.json` and "
        "`results/`; the answers, problem by problem, are in [writeup_2026.html](writeup_2026.html) "
        "([pdf](writeup_2026.pdf)) for the spring 2026 handout and [writeup_2025.html](writeup_2025.html) "
        "([pdf](writeup_2025.pdf)) for spring 2025; each notebook's own HTML has the details.",
        "",
        "## Where each notebook ran",
        "",
        _markdown_table(
            [dict(r, notebook=f"[{r['name']}]({r['name']}.html)") for r in runs],
            [
                ("notebook", "notebook"),
                ("status", "status"),
                ("machine", "machine"),
                ("commit", "commit"),
                ("date", "date"),
            ],
        ),
        "## Headline numbers",
        "",
        _markdown_table(
            headlines,
            [("notebook", "problem"), ("key", "quantity"), ("value", "value"), ("unit", "unit"), ("note", "note")],
        ),
        "## Not run on the machine of the run",
        "",
        _markdown_table(
            not_run,
            [("notebook", "problem"), *[(k, k) for k in sorted({k for r in not_run for k in r} - {"notebook"})]],
        ),
        "## Known problems",
        "",
        _markdown_table(caveats, [("notebook", "notebook"), ("caveat", "caveat")]),
    ]
    out = Path(report_dir) / "README.md"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out
