"""``loader.report(html=path)``: the report as one self-contained HTML page (inline SVG, no
script, nothing fetched), which opens offline.

It shows, top to bottom: the bottleneck verdict with its evidence and knob; the figures;
each stage's utilisation; the consumer's wait for each batch against its own step (in red,
as TensorFlow's input-pipeline analyzer draws it); the ``"auto"`` tuners' decisions over
time; and, when the epoch ran inside :func:`asyncloader.trace`, a timeline of its last
events, a lane per thread of each process.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncloader._tuning.report import Diagnosis
from asyncloader._tuning.stats import LoaderStats

WIDTH = 960
#: Slices drawn in the timeline at most: the last ones (a page stays small).
TIMELINE_SLICES = 3000
#: Colours by a slice's first word.
COLOURS = {
    "wait": "#d62728",
    "fetch": "#1f77b4",
    "transform": "#ff7f0e",
    "collate": "#2ca02c",
    "share": "#9467bd",
    "batch": "#8c8c8c",
    "pin": "#17becf",
    "copy": "#17becf",
}


@dataclass(frozen=True)
class PageData:
    """What the page draws besides the stats: the consumer's ``(step_ms, wait_ms)`` per
    batch, the tuners' moves ``(seconds into the epoch, io limit, prefetch, window)``, and the
    trace events (Chrome trace-event dicts) if a trace ran."""

    steps: Sequence[tuple[float, float]]
    tuned: Sequence[tuple[float, int | None, int, int]]
    events: Sequence[dict[str, Any]] = ()


def render_page(stats: LoaderStats, diagnosis: Diagnosis, data: PageData, title: str) -> str:
    """The page, as text."""
    sections = [
        _verdict(diagnosis),
        _figures(stats),
        _section("Stage utilisation", _utilisation(stats)),
        _section("The consumer's step and its wait for each batch", _steps(data.steps)),
        _section("Tuner decisions", _tuned(data.tuned)),
        _section("Timeline", _timeline(data.events)),
    ]
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{''.join(sections)}</body></html>\n"
    )


STYLE = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}"
    "h1{font-size:20px}h2{font-size:16px;margin-top:28px}"
    ".verdict{padding:12px 16px;background:#fff4e5;border-left:4px solid #ff7f0e}"
    "table{border-collapse:collapse}td{padding:2px 12px 2px 0}"
    "svg text{font:11px system-ui,sans-serif}.note{color:#666}"
)


def _section(heading: str, body: str) -> str:
    return f"<h2>{html.escape(heading)}</h2>{body}"


def _verdict(diagnosis: Diagnosis) -> str:
    return (
        f"<div class='verdict'><b>bottleneck: {html.escape(diagnosis.stage)}</b><br>"
        f"{html.escape(diagnosis.evidence)}<br><i>{html.escape(diagnosis.knob)}</i></div>"
    )


def _figures(stats: LoaderStats) -> str:
    rows = [
        ("samples/s", f"{stats.throughput:,.0f}"),
        ("batches", f"{stats.batches}"),
        ("waiting for data", f"{stats.stall_fraction:.0%} of the consumer's time"),
        ("wait per batch p50 / p95 / p99", " / ".join(
            "-" if v is None else f"{v:.3g} ms"
            for v in (stats.wait_p50_ms, stats.wait_p95_ms, stats.wait_p99_ms)
        )),
        ("first batch", "-" if stats.first_batch is None else f"{stats.first_batch:.3g} s"),
    ] + [
        (f"wait p50 / p95, batches of worker {w}", f"{f['p50_ms']:.3g} / {f['p95_ms']:.3g} ms")
        for w, f in stats.wait_by_worker.items()
    ]  # fmt: skip
    cells = "".join(f"<tr><td>{k}</td><td><b>{v}</b></td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _utilisation(stats: LoaderStats) -> str:
    """A bar per stage: how full it was on average (the report's rules read the same)."""
    bars: list[tuple[str, float, str]] = [
        ("consumer busy", 1.0 - stats.stall_fraction, "its own step, not waiting"),
    ]
    if stats.fetch_in_flight is not None and stats.fetch_limit:
        text = f"{stats.fetch_in_flight:.3g} of {stats.fetch_limit} samples in flight"
        bars.append(("fetch", stats.fetch_in_flight / stats.fetch_limit, text))
    if stats.engine_window:
        text = f"{stats.engine_in_flight:.3g} of {stats.engine_window} batches"
        bars.append(("engine (workers)", stats.engine_in_flight / stats.engine_window, text))
    if stats.device_busy:
        bars.append(("device stage", stats.device_busy, "busy share of the epoch"))
    row, label_w, bar_w = 22, 140, 500
    parts = []
    for i, (name, share, text) in enumerate(bars):
        y, share = i * row, max(0.0, min(1.0, share))
        colour = "#d62728" if share >= 0.75 else "#1f77b4"
        parts.append(
            f"<text x='0' y='{y + 14}'>{html.escape(name)}</text>"
            f"<rect x='{label_w}' y='{y + 3}' width='{bar_w}' height='14' fill='#eee'/>"
            f"<rect x='{label_w}' y='{y + 3}' width='{share * bar_w:.1f}' height='14' "
            f"fill='{colour}'/><text x='{label_w + bar_w + 8}' y='{y + 14}'>"
            f"{share:.0%}: {html.escape(text)}</text>"
        )
    return _svg(len(bars) * row, "".join(parts))


def _steps(steps: Sequence[tuple[float, float]]) -> str:
    """A stacked bar per batch: the consumer's step (grey) and its wait (red)."""
    if not steps:
        return "<p class='note'>No batch after the first yet.</p>"
    height, top = 160, max(step + wait for step, wait in steps) or 1.0
    width = WIDTH / len(steps)
    parts = []
    for i, (step, wait) in enumerate(steps):
        x = i * width
        h_step, h_wait = step / top * height, wait / top * height
        parts.append(
            f"<rect x='{x:.2f}' y='{height - h_step:.2f}' width='{max(width, 0.5):.2f}' "
            f"height='{h_step:.2f}' fill='#bbb'/>"
            f"<rect x='{x:.2f}' y='{height - h_step - h_wait:.2f}' "
            f"width='{max(width, 0.5):.2f}' height='{h_wait:.2f}' fill='#d62728'>"
            f"<title>step {i + 1}: {step:.3g} ms, then a wait of {wait:.3g} ms</title></rect>"
        )
    parts.append(f"<text x='2' y='12'>{top:.3g} ms</text>")
    note = (
        f"<p class='note'>{len(steps)} batches; grey: the consumer's own step, red: its wait "
        "for the next batch.</p>"
    )
    return _svg(height, "".join(parts)) + note


def _tuned(tuned: Sequence[tuple[float, int | None, int, int]]) -> str:
    if not tuned:
        return "<p class='note'>No move of an <code>\"auto\"</code> setting in this epoch.</p>"
    rows = "".join(
        f"<tr><td>{at:.2f} s</td><td>{'-' if limit is None else limit}</td>"
        f"<td>{prefetch}</td><td>{window}</td></tr>"
        for at, limit, prefetch, window in tuned
    )
    head = "<tr><td>when</td><td>io limit</td><td>prefetch</td><td>window</td></tr>"
    return f"<table>{head}{rows}</table>"


def _timeline(events: Sequence[dict[str, Any]]) -> str:
    """The last :data:`TIMELINE_SLICES` slices, a lane per (process, thread); async slices
    (a batch's round trip, its fetch on the loop) in lanes of their own."""
    slices = list(_slices(events))[-TIMELINE_SLICES:]
    if not slices:
        return (
            "<p class='note'>Run the epoch inside <code>with asyncloader.trace(path):</code> "
            "for a timeline of every stage.</p>"
        )
    names = _names(events)
    lanes = sorted({lane for lane, *_ in slices}, key=lambda lane: (lane[0], str(lane[1])))
    start = min(ts for _, ts, _, _ in slices)
    end = max(ts + dur for _, ts, dur, _ in slices)
    scale = (WIDTH - 200) / max(end - start, 1.0)
    row = 16
    parts = []
    for i, lane in enumerate(lanes):
        parts.append(
            f"<text x='0' y='{i * row + 12}'>{html.escape(_lane_label(lane, names))}</text>"
        )
    for lane, ts, dur, name in slices:
        y = lanes.index(lane) * row
        colour = COLOURS.get(name.split()[0], "#7f7f7f")
        parts.append(
            f"<rect x='{200 + (ts - start) * scale:.2f}' y='{y + 2}' "
            f"width='{max(dur * scale, 0.5):.2f}' height='{row - 4}' fill='{colour}'>"
            f"<title>{html.escape(name)}: {dur / 1e3:.3g} ms</title></rect>"
        )
    note = (
        f"<p class='note'>The last {len(slices)} slices, {(end - start) / 1e6:.3g} s; red: "
        "the consumer's waits; blue: fetch; orange: transform; green: collate; purple: hand-off; "
        "grey: a batch's round trip through the engine.</p>"
    )
    return _svg(len(lanes) * row, "".join(parts)) + note


def _slices(
    events: Iterable[dict[str, Any]],
) -> Iterable[tuple[tuple[Any, ...], float, float, str]]:
    """``(lane, start, duration, name)`` of the complete slices, and of async slices paired
    by their begin and end."""
    begun: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in sorted((e for e in events if "ts" in e), key=lambda e: e["ts"]):
        if e["ph"] == "X":
            yield (e["pid"], e["tid"]), e["ts"], e.get("dur", 0.0), e["name"]
        elif e["ph"] == "b":
            begun[(e["pid"], e["cat"], e["id"])] = e
        elif e["ph"] == "e" and (b := begun.pop((e["pid"], e["cat"], e["id"]), None)):
            yield (e["pid"], b["cat"]), b["ts"], e["ts"] - b["ts"], b["name"]


def _names(events: Iterable[dict[str, Any]]) -> dict[tuple[Any, ...], str]:
    names: dict[tuple[Any, ...], str] = {}
    for e in events:
        if e.get("ph") == "M" and e["name"] == "process_name":
            names[(e["pid"],)] = e["args"]["name"]
        elif e.get("ph") == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    return names


def _lane_label(lane: tuple[Any, ...], names: dict[tuple[Any, ...], str]) -> str:
    process = names.get((lane[0],), f"pid {lane[0]}")
    what = names.get(lane, lane[1]) if isinstance(lane[1], int) else f"{lane[1]} (async)"
    return f"{process}: {what}"[:32]


def _svg(height: float, body: str) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height + 4:.0f}' "
        f"viewBox='0 0 {WIDTH} {height + 4:.0f}'>{body}</svg>"
    )
