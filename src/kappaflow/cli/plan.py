"""How ``jobs check`` shows a job's plan to a person."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def show_plan(plan: dict[str, Any]) -> None:
    out = Console(highlight=False)
    out.print(f"[bold]job {plan['job']}[/bold]  checkpoint {plan['checkpoint']}")
    for source in plan["sources"]:
        exists = "" if source["topic_exists"] else "  [yellow](topic does not exist yet)[/yellow]"
        out.print(
            f"  source {source['topic']}{exists}: {source['schema']}, key {source['key']}, "
            f"time {source['time']}, id {source['id']}, watermark {source['watermark_ms']} ms, "
            f"allowed lateness {source['allowed_lateness_ms']} ms, from {source['start']}"
        )
    for table in plan.get("tables", []):
        exists = "" if table["topic_exists"] else "  [yellow](topic does not exist yet)[/yellow]"
        kind = f"compacted topic, {table['schema']}" if table["kafka"] else "parquet"
        out.print(f"  table {table['table']}{exists}: {kind}, key {table['key']}")
    for output in plan["outputs"]:
        if "window" in output:
            window = output["window"]
            slide = f" every {window['slide_ms']} ms" if window["slide_ms"] else ""
            shape = (
                f"sessions with a gap of {window['size_ms']} ms"
                if window.get("session")
                else f"windows of {window['size_ms']} ms{slide}"
            )
            what = f"{shape} by {output['by']}: " + ", ".join(
                f"{k}={v}" for k, v in output["aggregates"].items()
            )
        elif "stateful" in output:
            state = output["stateful"]
            what = f"stateful function {state['function']} by {state['by']}"
        else:
            what = "records"
        joins = "".join(
            f" joined {j['how']} with {j['kind']} {j['with']} on {j['on']}"
            + (f" within {j['within_ms']} ms" if j["within_ms"] is not None else "")
            for j in output.get("joins", [])
        )
        out.print(f"  output {output['name']} from {output['source']}{joins}: {what}")
        for sink in output["sinks"]:
            where = next(f"{k} {v}" for k, v in sink.items() if k in ("kafka", "redis", "parquet"))
            out.print(f"    -> {where}: {sink['guarantee']}")
    out.print(f"  dead letters -> {plan['dead_letters']}; too-late events -> {plan['late']}")
    out.print(f"  restart: {plan['restart']}")
