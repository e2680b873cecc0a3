"""Small HTML building blocks for the dashboard: every value that reaches a page goes through
`esc` (or `table`, which escapes each cell), so a topic, key or body cannot inject markup.
`Raw` marks markup this package built itself (a link, a form) and is passed through as is."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
header{background:#1d2b45;color:#fff;padding:.6em 1.2em;display:flex;gap:1.4em;align-items:center}
header a{color:#cfe0ff;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .brand{font-weight:700;color:#fff}main{padding:1em 1.4em}
header .who{margin-left:auto;color:#cfe0ff}
h1{font-size:1.3em;margin:.2em 0 .6em}h2{font-size:1.05em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;margin:.3em 0 1em;font-size:.9em}
th,td{border:1px solid #d9dde5;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eef1f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:600;background:#f7f8fb}
.leader{color:#0a7a32;font-weight:600}.bad{color:#b3261e;font-weight:600}.muted{color:#778}
.error{background:#fdecea;border:1px solid #f5c2bd;padding:.6em 1em;color:#8a1c14}
.notice{background:#e8f4ea;border:1px solid #b9dfc2;padding:.6em 1em}
form.inline{display:inline}form.box{background:#fff;border:1px solid #d9dde5;padding:.6em 1em;
margin:.4em 0 1em;display:flex;gap:.6em;align-items:end;flex-wrap:wrap}
td form.box{margin:0;padding:0;border:0;background:none}
label{display:flex;flex-direction:column;font-size:.85em;gap:.2em}
input{padding:.25em .4em}button{padding:.3em .8em;cursor:pointer}
button.danger{background:#b3261e;color:#fff;border:0;border-radius:3px}
pre{background:#fff;border:1px solid #d9dde5;padding:.6em;white-space:pre-wrap;
word-break:break-all;max-width:100%}
"""


@dataclass(frozen=True, slots=True)
class Raw:
    """Markup built by this package (already escaped where it holds values)."""

    markup: str

    def __str__(self) -> str:
        return self.markup


Cell = str | int | Raw | None


def esc(value: Cell) -> str:
    if isinstance(value, Raw):
        return value.markup
    if value is None:
        return ""
    return html.escape(str(value), quote=True)


def link(path: str, text: Cell, **query: str | int) -> Raw:
    href = path + ("?" + urlencode(query) if query else "")
    return Raw(f'<a href="{esc(href)}">{esc(text)}</a>')


def span(cls: str, text: Cell) -> Raw:
    return Raw(f'<span class="{esc(cls)}">{esc(text)}</span>')


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Cell]],
    *,
    numeric: Iterable[int] = (),
    total: Sequence[Cell] | None = None,
    table_id: str = "",
) -> Raw:
    """A table; columns whose index is in `numeric` are right-aligned; `total` is a last,
    bold row."""
    nums = set(numeric)
    attr = f' id="{esc(table_id)}"' if table_id else ""
    out = [f"<table{attr}><thead><tr>"]
    out += [f"<th>{esc(h)}</th>" for h in headers]
    out.append("</tr></thead><tbody>")

    def row(cells: Sequence[Cell], cls: str = "") -> None:
        out.append(f'<tr class="{cls}">' if cls else "<tr>")
        for i, c in enumerate(cells):
            out.append(f'<td class="num">{esc(c)}</td>' if i in nums else f"<td>{esc(c)}</td>")
        out.append("</tr>")

    empty = True
    for r in rows:
        empty = False
        row(r)
    if empty:
        out.append(f'<tr><td colspan="{len(headers)}" class="muted">none</td></tr>')
    if total is not None:
        row(total, "total")
    out.append("</tbody></table>")
    return Raw("".join(out))


def form(
    action: str,
    fields: Sequence[tuple[str, str, str]],
    *,
    method: str = "get",
    button: str = "Show",
    hidden: Mapping[str, str] | None = None,
    form_id: str = "",
    danger: bool = False,
) -> Raw:
    """A form of labelled inputs: fields are (name, label, current value)."""
    attr = f' id="{esc(form_id)}"' if form_id else ""
    out = [f'<form class="box" method="{esc(method)}" action="{esc(action)}"{attr}>']
    for name, value in (hidden or {}).items():
        out.append(f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">')
    for name, label, value in fields:
        out.append(f'<label>{esc(label)}<input name="{esc(name)}" value="{esc(value)}"></label>')
    cls = ' class="danger"' if danger else ""
    out.append(f'<button type="submit"{cls}>{esc(button)}</button></form>')
    return Raw("".join(out))


def fmt_ms(ms: int) -> str:
    """Local time of a ms timestamp; "-" for 0 (an empty queue)."""
    if ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def page(
    title: str,
    nav: Sequence[tuple[str, str]],
    current: str,
    body: Iterable[Cell],
    who: str = "",
) -> str:
    """A whole document: the navigation bar (path, title), who is signed in (with a sign-out
    link), and the body parts in order."""
    links = "".join(
        f'<a href="{esc(p)}"{" class=on" if p == current else ""}>{esc(t)}</a>' for p, t in nav
    )
    if who:
        links += f'<span class="who" id="who">{esc(who)} <a href="/logout">sign out</a></span>'

    content = "".join(esc(b) for b in body)
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{esc(title)} · raftmq</title><style>{CSS}</style></head><body>"
        f'<header><span class="brand">raftmq</span>{links}</header>'
        f"<main><h1>{esc(title)}</h1>{content}</main></body></html>"
    )


def bar_chart(
    points: Sequence[tuple[int, float]],
    *,
    width: int = 640,
    height: int = 120,
    label: str = "",
    chart_id: str = "",
) -> Raw:
    """An inline SVG bar chart of (ms timestamp, value) points, oldest first: for per-minute
    counts (the resource reports). SVG, not a script, so the pages stay script-free; each bar's
    <title> is its time and value (a tooltip)."""
    attr = f' id="{esc(chart_id)}"' if chart_id else ""
    if not points:
        return Raw(f'<p class="muted"{attr}>no data{": " + esc(label) if label else ""}</p>')
    top = max(v for _, v in points) or 1.0
    bar = width / len(points)
    out = [
        f'<svg{attr} xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 16}" '
        f'role="img" aria-label="{esc(label)}" style="background:#fff;border:1px solid #d9dde5">'
    ]
    for i, (ms, v) in enumerate(points):
        h = max(0.0, v) / top * (height - 4)
        out.append(
            f'<rect x="{i * bar:.1f}" y="{height - h:.1f}" width="{max(bar - 1, 0.5):.1f}" '
            f'height="{h:.1f}" fill="#3b6fb6"><title>{esc(fmt_ms(ms))}: {esc(f"{v:g}")}'
            "</title></rect>"
        )
    out.append(
        f'<text x="2" y="{height + 13}" font-size="11" fill="#556">{esc(label)} '
        f"(max {esc(f'{top:g}')})</text></svg>"
    )
    return Raw("".join(out))
