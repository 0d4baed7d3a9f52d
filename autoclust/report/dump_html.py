"""clustering.html: the clustered graph as one self-contained page (no network, no libraries).

    graph inputs (white pills)             row 0
      |  arrows follow the data
    +- cluster_0000 · 11 nodes -----+       every cluster: a coloured box around its nodes,
    |  [Mul] [Add] ...               |      labelled with its name and size
    +--------------------------------+      grey nodes run in onnxruntime (hover: why)
    graph outputs (white pills)            last row

Layout: a node's row is its longest path from the graph inputs; each cluster (and each
unclustered node) is a block of columns spanning its rows, and blocks are packed so that
blocks sharing rows never share columns, which keeps the cluster boxes disjoint. Inside a
block, nodes sit under their producers where they can. The side panel holds the legend
and the details of the node under the mouse (or clicked).
"""

from __future__ import annotations

import dataclasses
import html
import json
from typing import Any

COLORS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
          "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f")
GREY = "#d9d9d9"
NODE_W, NODE_H = 172, 38
COL_W, ROW_H = NODE_W + 28, NODE_H + 46  # pitch between node origins
BOX_X, BOX_TOP, BOX_BOTTOM = 10, 24, 8  # cluster box margins around its nodes
MARGIN = 30
# Monospace label widths are predictable: at most this many characters fit a node.
OP_CHARS, TYPE_CHARS = 21, 26


def cluster_color(cid: int) -> str:
    """The fill colour of cluster `cid` (grey for -1: not clustered)."""
    return COLORS[cid % len(COLORS)] if cid >= 0 else GREY


@dataclasses.dataclass
class _Block:
    """A cluster's nodes (or one unclustered node) with rows and columns relative to it."""

    cluster: Any
    nodes: list[Any]
    row0: int
    row1: int
    width: int
    cols: dict[str, int]
    x: int = 0


def _rows(graph: Any) -> dict[str, int]:
    """Row per node: 1 + the longest path from a graph input (inputs are row 0). Side
    chains (an attention mask, an embedding lookup: nodes with slack whose producers are
    side chains too) then move down to just above their first consumer."""
    producer = {v.name: n.name for n in graph.nodes for v in n.outputs}
    preds = {n.name: [producer[v.name] for v in n.inputs if v is not None and v.name in producer]
             for n in graph.nodes}
    consumers: dict[str, list[str]] = {}
    asap: dict[str, int] = {}
    for n in graph.nodes:
        asap[n.name] = 1 + max((asap[p] for p in preds[n.name]), default=0)
        for p in preds[n.name]:
            consumers.setdefault(p, []).append(n.name)
    alap: dict[str, int] = {}
    for n in reversed(graph.nodes):
        alap[n.name] = min((alap[c] - 1 for c in consumers.get(n.name, ())),
                           default=asap[n.name])
    side: set[str] = set()
    for n in graph.nodes:
        if alap[n.name] > asap[n.name] and all(p in side for p in preds[n.name]):
            side.add(n.name)
    row = dict(asap)
    for n in reversed(graph.nodes):
        if n.name in side:
            row[n.name] = min(row[c] for c in consumers[n.name]) - 1
    return row


def _spread(desired: list[float], width: int | None) -> list[int]:
    """Distinct integer columns, in order, each as near its desired column as fits."""
    cols: list[int] = []
    for d in desired:
        cols.append(max(round(d), cols[-1] + 1 if cols else 0))
    if width is not None:
        limit = width - 1
        for i in reversed(range(len(cols))):
            cols[i] = min(cols[i], limit)
            limit = cols[i] - 1
    return cols


def _block(cluster: Any, nodes: list[Any], row: dict[str, int]) -> _Block:
    """Columns inside one block: each row's nodes ordered under their in-block producers."""
    by_row: dict[int, list[Any]] = {}
    for n in nodes:
        by_row.setdefault(row[n.name], []).append(n)
    width = max(len(v) for v in by_row.values())
    producer = {v.name: n.name for n in nodes for v in n.outputs}
    cols: dict[str, int] = {}
    for r in sorted(by_row):
        desired = []
        for i, n in enumerate(by_row[r]):
            mine = [cols[producer[v.name]] for v in n.inputs
                    if v is not None and v.name in producer]
            desired.append((sum(mine) / len(mine) if mine else i, i, n))
        desired.sort(key=lambda t: (t[0], t[1]))
        spread = _spread([d for d, _, _ in desired], width)
        for (_, _, n), c in zip(desired, spread):
            cols[n.name] = c
    return _Block(cluster, nodes, min(by_row), max(by_row), width, cols)


def _place(block: _Block, placed: list[_Block], want: float) -> int:
    """The column nearest `want` where `block` overlaps no placed block sharing its rows."""
    busy = [b for b in placed if b.row0 <= block.row1 and block.row0 <= b.row1]
    candidates = {max(0, round(want))} | {0}
    for b in busy:
        candidates |= {b.x + b.width, max(0, b.x - block.width)}

    def free(x: int) -> bool:
        return all(x + block.width <= b.x or b.x + b.width <= x for b in busy)
    return min((x for x in candidates if free(x)), key=lambda x: (abs(x - want), x))


@dataclasses.dataclass
class Layout:
    """Grid positions: (column, row) for nodes, graph inputs and graph outputs."""

    nodes: dict[str, tuple[int, int]]
    inputs: dict[str, tuple[int, int]]
    outputs: dict[str, tuple[int, int]]
    boxes: list[tuple[Any, int, int, int, int]]  # (cluster, col0, col1, row0, row1)
    columns: int
    rows: int


def layout(plan: Any) -> Layout:
    """Place every node, graph input and graph output of `plan` on a grid."""
    graph = plan.graph
    row = _rows(graph)
    owner = {n.name: c for c in plan.clusters for n in c.nodes}
    blocks = [_block(c, c.nodes, row) for c in plan.clusters]
    blocks += [_block(None, [n], row) for n in graph.nodes if n.name not in owner]
    blocks.sort(key=lambda b: (b.row0, b.row1))
    producer = {v.name: n.name for n in graph.nodes for v in n.outputs}
    pos: dict[str, tuple[int, int]] = {}
    placed: list[_Block] = []
    for b in blocks:
        outside = [pos[producer[v.name]][0] for n in b.nodes for v in n.inputs
                   if v is not None and v.name in producer and producer[v.name] in pos]
        want = sum(outside) / len(outside) - (b.width - 1) / 2 if outside else 0
        b.x = _place(b, placed, want)
        placed.append(b)
        for n in b.nodes:
            pos[n.name] = (b.x + b.cols[n.name], row[n.name])
    inputs = _terminals(_graph_inputs(graph), graph, pos, 0, consumers=True)
    last = max((r for _, r in pos.values()), default=0) + 1
    outputs = _terminals(graph.outputs, graph, {**pos, **inputs}, last, consumers=False)
    boxes = [(b.cluster, b.x, b.x + b.width - 1, b.row0, b.row1) for b in placed if b.cluster]
    boxes.sort(key=lambda t: t[0].id)
    every = list(pos.values()) + list(inputs.values()) + list(outputs.values())
    columns = 1 + max((c for c, _ in every), default=0)
    return Layout(pos, inputs, outputs, boxes, columns, last + (1 if outputs else 0))


def _graph_inputs(graph: Any) -> list[Any]:
    return [v for v in graph.inputs if v.name not in graph.initializers]


def _terminals(values: list[Any], graph: Any, pos: dict[str, tuple[int, int]], row: int,
               consumers: bool) -> dict[str, tuple[int, int]]:
    """Columns for graph inputs (over their consumers) or outputs (under their producer)."""
    near: dict[str, list[str]] = {}
    for n in graph.nodes:
        for v in (n.inputs if consumers else n.outputs):
            if v is not None:
                near.setdefault(v.name, []).append(n.name)
    desired = []
    for i, v in enumerate(values):
        cols = [pos[k][0] for k in near.get(v.name, []) if k in pos]
        if not cols and v.name in pos:  # an output that is a graph input
            cols = [pos[v.name][0]]
        desired.append((sum(cols) / len(cols) if cols else i, i, v.name))
    desired.sort()
    return {name: (c, row) for (_, _, name), c in zip(desired, _spread([d[0] for d in desired],
                                                                        None))}


# ---- SVG ------------------------------------------------------------------------------
def _xy(cell: tuple[int, int]) -> tuple[int, int]:
    return MARGIN + cell[0] * COL_W, MARGIN + cell[1] * ROW_H


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _edges(plan: Any, lay: Layout) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(from cell, to cell) for every data dependency drawn, without duplicates."""
    graph = plan.graph
    source = {v.name: lay.nodes[n.name] for n in graph.nodes for v in n.outputs}
    source.update(lay.inputs)
    seen = []
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and v.name in source:
                seen.append((source[v.name], lay.nodes[n.name]))
    for name, cell in lay.outputs.items():
        if name in source:
            seen.append((source[name], cell))
    return list(dict.fromkeys(seen))


def _edge_svg(a: tuple[int, int], b: tuple[int, int]) -> str:
    (ax, ay), (bx, by) = _xy(a), _xy(b)
    x1, x2 = ax + NODE_W / 2, bx + NODE_W / 2
    y1, y2 = ay + NODE_H, by - 2  # the arrowhead's tip touches the box
    bend = max(20, (y2 - y1) / 2)
    return (f'<path class="edge" d="M{x1},{y1} C{x1},{y1 + bend} {x2},{y2 - bend} {x2},{y2}" '
            f'marker-end="url(#arrow)"/>')


def _box_svg(cluster: Any, col0: int, col1: int, row0: int, row1: int) -> tuple[str, str]:
    """The cluster's box, and its label (drawn after the edges, so none crosses it)."""
    x0, y0 = _xy((col0, row0))
    x1, y1 = _xy((col1, row1))
    x, y = x0 - BOX_X, y0 - BOX_TOP
    w, h = x1 + NODE_W + BOX_X - x, y1 + NODE_H + BOX_BOTTOM - y
    color = cluster_color(cluster.id)
    count = len(cluster.nodes)
    label = html.escape(f"{cluster.name} · {count} node{'' if count == 1 else 's'}")
    name = html.escape(cluster.name)
    rect = (f'<g class="cluster" id="box-{name}" data-cluster="{name}">'
            f'<rect class="cluster-box" x="{x}" y="{y}" width="{w}" height="{h}" rx="8" '
            f'fill="{color}" fill-opacity="0.28" stroke="{color}" stroke-width="2.5"/></g>')
    text = (f'<text class="cluster-label" data-cluster="{name}" x="{x + 8}" y="{y + 16}">'
            f'{label}</text>')
    return rect, text


def _node_svg(i: int, row: dict[str, Any], cell: tuple[int, int]) -> str:
    x, y = _xy(cell)
    fill = cluster_color(row["cid"])
    cluster = html.escape(row["cluster"] or "")
    tip = html.escape(f"{row['name']} ({row['op']})\n{row['cluster'] or row['reason']}")
    first = row["outputs"][0].split(": ", 1)[-1] if row["outputs"] else ""
    return (f'<g class="n" data-i="{i}" data-cluster="{cluster}"><title>{tip}</title>'
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="4" fill="{fill}" '
            f'stroke="#333"/><text class="op" x="{x + 6}" y="{y + 16}">'
            f'{html.escape(_short(row["op"], OP_CHARS))}</text><text class="ty" x="{x + 6}" '
            f'y="{y + 31}">{html.escape(_short(first, TYPE_CHARS))}</text></g>')


def _io_svg(kind: str, value: Any, cell: tuple[int, int]) -> str:
    x, y = _xy(cell)
    name = html.escape(value.name)
    return (f'<g class="io {kind}" data-name="{name}"><title>graph {kind} {name}: '
            f'{html.escape(value.type_str())}</title><rect x="{x}" y="{y}" width="{NODE_W}" '
            f'height="{NODE_H}" rx="{NODE_H // 2}" fill="#fff" stroke="#333" '
            f'stroke-width="1.5"/><text class="op" x="{x + 14}" y="{y + 16}">'
            f'{html.escape(_short(value.name, OP_CHARS - 2))}</text><text class="ty" '
            f'x="{x + 14}" y="{y + 31}">{html.escape(_short(value.type_str(), TYPE_CHARS - 2))}'
            f'</text></g>')


def svg(plan: Any, rows: list[dict[str, Any]]) -> str:
    """The graph picture: boxes, edges, box labels, then nodes and graph inputs/outputs."""
    lay = layout(plan)
    width = 2 * MARGIN + lay.columns * COL_W
    height = 2 * MARGIN + lay.rows * ROW_H
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" id="graph" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}">'),
           ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            'fill="#555"/></marker></defs>')]
    boxes = [_box_svg(*box) for box in lay.boxes]
    out += [rect for rect, _ in boxes]
    out += [_edge_svg(a, b) for a, b in _edges(plan, lay)]
    out += [label for _, label in boxes]
    out += [_node_svg(i, r, lay.nodes[r["name"]]) for i, r in enumerate(rows)]
    by_name = {v.name: v for v in list(plan.graph.inputs) + list(plan.graph.outputs)}
    out += [_io_svg("input", by_name[k], cell) for k, cell in lay.inputs.items()]
    out += [_io_svg("output", by_name[k], cell) for k, cell in lay.outputs.items()]
    out.append("</svg>")
    return "".join(out)


# ---- the page -------------------------------------------------------------------------
def _legend(plan: Any, rows: list[dict[str, Any]]) -> str:
    items = []
    for c in plan.clusters:
        n = len(c.nodes)
        items.append(f'<li class="legend-item legend-cluster" data-cluster="{html.escape(c.name)}">'
                     f'<span class="sw" style="background:{cluster_color(c.id)}"></span>'
                     f'<b>{html.escape(c.name)}</b> {n} node{"" if n == 1 else "s"}: compiled '
                     'together</li>')
    left = sum(1 for r in rows if r["cid"] < 0)
    items.append(f'<li class="legend-item"><span class="sw" style="background:{GREY}"></span>'
                 f'not clustered ({left}): runs in onnxruntime; hover for why</li>')
    items.append('<li class="legend-item"><span class="sw pill"></span>graph input / output'
                 '</li>')
    items.append('<li class="legend-item"><svg width="28" height="10"><line x1="0" y1="5" '
                 'x2="20" y2="5" stroke="#555" stroke-width="1.5" marker-end="url(#arrow)"/>'
                 '</svg>data flows along the arrow</li>')
    return f'<ul id="legend">{"".join(items)}</ul>'


_STYLE = """body{font-family:sans-serif;margin:0;display:flex;height:100vh}
#g{flex:1;overflow:auto;position:relative}
#tools{position:sticky;top:0;left:0;z-index:1;background:#fffe;padding:4px 8px;
 border-bottom:1px solid #ccc;font-size:13px}
#p{width:360px;padding:10px 12px;border-left:1px solid #ccc;overflow:auto;font-size:13px}
#legend{list-style:none;padding:0;margin:8px 0 12px}
.legend-item{margin:3px 0;display:flex;align-items:center;gap:6px}
.legend-cluster{cursor:pointer}
.sw{display:inline-block;width:16px;height:12px;border:1px solid #333;border-radius:2px}
.sw.pill{border-radius:6px;background:#fff}
#details{white-space:pre-wrap;border-top:1px solid #ccc;padding-top:8px}
text{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;fill:#111}
text.op{font-size:12px;font-weight:bold} text.ty{font-size:10px;fill:#333}
text.cluster-label{font-size:12px;font-weight:bold;font-family:sans-serif;
 paint-order:stroke;stroke:#fff;stroke-width:4px;stroke-linejoin:round}
path.edge{fill:none;stroke:#666;stroke-width:1.3}
g.n,g.io{cursor:pointer} g.n.sel rect{stroke:#d00;stroke-width:3}
g.cluster.sel rect{stroke-width:5}"""

_SCRIPT = """
const rows = DATA;
const svg = document.getElementById('graph');
const W = +svg.getAttribute('width'), H = +svg.getAttribute('height');
let scale = 1;
function zoom(s) {
  scale = Math.min(2, Math.max(0.1, s));
  svg.setAttribute('width', W * scale); svg.setAttribute('height', H * scale);
  document.getElementById('zl').textContent = Math.round(scale * 100) + '%';
}
document.getElementById('zin').onclick = () => zoom(scale * 1.25);
document.getElementById('zout').onclick = () => zoom(scale / 1.25);
document.getElementById('zfit').onclick = () =>
  zoom(Math.min(1, (document.getElementById('g').clientWidth - 20) / W));
function show(i) {
  const r = rows[i];
  document.getElementById('details').textContent = r.name + '\\nop: ' + r.op + '\\n' +
    (r.cluster ? 'cluster: ' + r.cluster : 'not clustered: ' + r.reason) +
    '\\ninputs: ' + r.inputs.join(', ') + '\\noutputs:\\n  ' + r.outputs.join('\\n  ');
}
let pinned = null;
document.querySelectorAll('g.n').forEach(g => {
  g.addEventListener('click', () => {
    if (pinned) pinned.classList.remove('sel');
    pinned = g; g.classList.add('sel'); show(+g.dataset.i);
  });
  g.addEventListener('mouseenter', () => show(+g.dataset.i));
  g.addEventListener('mouseleave', () => { if (pinned) show(+pinned.dataset.i); });
});
document.querySelectorAll('li.legend-cluster').forEach(li => {
  li.addEventListener('click', () => {
    const box = document.getElementById('box-' + li.dataset.cluster);
    document.querySelectorAll('g.cluster.sel').forEach(b => b.classList.remove('sel'));
    box.classList.add('sel');
    box.scrollIntoView({block: 'start', inline: 'start'});
  });
});
"""


def to_html(plan: Any, rows: list[dict[str, Any]]) -> str:
    """The page: the SVG graph, a zoom bar, and a side panel with the legend and details."""
    n_left = sum(1 for r in rows if r["cid"] < 0)
    count = len(plan.clusters)
    summary = html.escape(f"{plan.graph.name or 'model'}: {count} cluster"
                          f"{'' if count == 1 else 's'}, {len(rows)} nodes, "
                          f"{n_left} not clustered")
    data = json.dumps(rows).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>autoclust clustering</title>
<style>{_STYLE}</style></head><body>
<div id="g"><div id="tools">zoom <button id="zout">&minus;</button> <span id="zl">100%</span>
<button id="zin">+</button> <button id="zfit">fit width</button></div>{svg(plan, rows)}</div>
<div id="p"><b id="summary">{summary}</b>{_legend(plan, rows)}
<div id="details">Hover over a node for its op, shapes and cluster (or why it has none);
click to pin it. Click a cluster in the legend to find it.</div></div>
<script>{_SCRIPT.replace("DATA", data, 1)}</script></body></html>
"""
