"""`mathrl report`: one self-contained HTML page that compares training runs.

    build_report([Path("runs/clip_sym"), Path("runs/clip_higher")], Path("clip.html"), title="clip-higher ablation")

This package is the report's public face; its modules, by concern:

    page.py     what to chart (SECTIONS), the page's styles and script, the HTML around the parts below
    runs.py     run directories read into the `Run` records the report compares
    tables.py   the report's tables: runs, evaluations, config differences, token maps

The line charts are analysis/charts.py's; docs/report.md describes the page.
"""

from mathrl.analysis.report.page import build_report
from mathrl.analysis.report.runs import Run, load_run, run_labels

__all__ = ["Run", "build_report", "load_run", "run_labels"]
