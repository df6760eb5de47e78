"""Rendering an apply run for people: a table per pin on the terminal."""

from __future__ import annotations

from sglpatch.project import ApplyReport


def render_apply(report: ApplyReport, report_path: str = "") -> str:
    lines = [f"series v{report.series_version} ({report.series_digest[:12]})", ""]
    for result in report.results:
        state = "ok" if result.ok else "FAILED"
        lines.append(f"sglang {result.version}: {state}  lock: {result.lock or '-'}")
        if result.patches:
            width = max(len(outcome.name) for outcome in result.patches)
            for outcome in result.patches:
                commit = outcome.commit[:12] if outcome.commit else "-"
                lines.append(f"  {outcome.name:<{width}}  {outcome.status:<19}  {commit}")
                for detail in outcome.detail.splitlines() if outcome.status not in ("applied",) else []:
                    lines.append(f"      {detail}")
        else:
            lines.append("  (no patches in the series)")
        if result.ok:
            lines.append(f"  tree: {result.tree_path}  (branch sglpatch at {result.commit[:12]})")
        if result.error:
            lines.append(f"  error: {result.error}")
        lines.append("")
    if report_path:
        lines.append(f"report: {report_path}")
    return "\n".join(lines)
