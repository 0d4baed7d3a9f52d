"""clustering.html: the layout's promises in Python, and the page as a browser draws it
(headless Chromium; skipped where none is installed: `apt-get install chromium`)."""

import html
import itertools
import json
import os
import re
import shutil
import subprocess

import onnx
import pytest
from autoclust.importers.onnx import import_model
from support import paths

from autoclust import flags, registry
from autoclust.clustering.partition import cluster
from autoclust.report import dump, dump_html

REPO = paths.REPO

# model, flags: BERT with MatMul left out interleaves 40 clusters with onnxruntime nodes.
PLANS = {
    "mixed_dynamic": ("mixed_dynamic", ""),
    "bert_encoder": ("bert_encoder", ""),
    "bert_no_matmul": ("bert_encoder", "--cluster_exclude_ops=MatMul"),
    "diffusion_block": ("diffusion_block", ""),
    "llama_min1": ("llama_block", "--min_cluster_size=1 --cluster_exclude_ops=Softmax"),
}


def make_plan(key):
    model, flag_text = PLANS[key]
    f = flags.parse(flag_text)
    graph = import_model(onnx.load(os.path.join(REPO, "models", f"{model}.onnx")))
    return cluster(graph, f, registry.get_backend("cpu").why_not)


def overlap(a, b):
    """Whether two (x0, y0, x1, y1) rectangles share any area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize("key", sorted(PLANS))
def test_layout_keeps_clusters_apart_and_edges_downward(key):
    plan = make_plan(key)
    lay = dump_html.layout(plan)
    graph = plan.graph
    assert set(lay.nodes) == {n.name for n in graph.nodes}
    cells = list(lay.nodes.values()) + list(lay.inputs.values()) + list(lay.outputs.values())
    assert len(set(cells)) == len(cells), "two things share a grid cell"
    producer = {v.name: n.name for n in graph.nodes for v in n.outputs}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and v.name in producer:
                assert lay.nodes[producer[v.name]][1] < lay.nodes[n.name][1], n.name
    assert {r for _, r in lay.inputs.values()} <= {0}
    assert {r for _, r in lay.outputs.values()} == {lay.rows - 1}
    assert len(lay.inputs) == len([v for v in graph.inputs if v.name not in graph.initializers])
    assert len(lay.outputs) == len(graph.outputs)
    assert [b[0].name for b in lay.boxes] == [c.name for c in plan.clusters]
    boxes = {c.name: (c0, r0, c1 + 1, r1 + 1) for c, c0, c1, r0, r1 in lay.boxes}
    for a, b in itertools.combinations(boxes.values(), 2):
        assert not overlap(a, b)
    owner = {n.name: c.name for c in plan.clusters for n in c.nodes}
    for name, (col, row) in lay.nodes.items():
        inside = [k for k, (c0, r0, c1, r1) in boxes.items() if c0 <= col < c1 and r0 <= row < r1]
        assert inside == ([owner[name]] if name in owner else []), name


def test_page_is_self_contained_and_names_everything():
    plan = make_plan("mixed_dynamic")
    page = dump.to_html(plan)
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page and "<script src" not in page
    assert page.count('class="cluster-box"') == 4 and page.count('class="cluster-label"') == 4
    assert page.count('class="legend-item legend-cluster"') == 4
    assert page.count('<g class="io input"') == 2 and page.count('<g class="io output"') == 4
    assert page.count('class="edge"') == len(dump_html._edges(plan, dump_html.layout(plan)))
    assert "data-dependent output shape" in page  # the reasons, for hover and the panel


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


# Runs in the page after its own script: measures what the browser drew.
CHECK_JS = """
const out = {};
const box = r => { const b = r.getBBox(); return [b.x, b.y, b.x + b.width, b.y + b.height]; };
const inside = (a, b) => a[0] >= b[0] && a[1] >= b[1] && a[2] <= b[2] && a[3] <= b[3];
const overlap = (a, b) => a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3];
const legend = document.getElementById('legend');
out.legend_visible = legend.offsetWidth > 0 && legend.offsetHeight > 0;
out.legend_clusters = [...document.querySelectorAll('li.legend-cluster')].map(
  li => li.dataset.cluster);
const boxes = {};
document.querySelectorAll('g.cluster').forEach(g => {
  boxes[g.dataset.cluster] = box(g.querySelector('rect.cluster-box'));
});
out.boxes = Object.keys(boxes);
const labels = [...document.querySelectorAll('text.cluster-label')];
out.labels_inside = labels.length === out.boxes.length && labels.every(t =>
  inside(box(t), boxes[t.dataset.cluster]) && t.textContent.startsWith(t.dataset.cluster));
const nodes = [...document.querySelectorAll('g.n')];
out.nodes = nodes.length;
out.outside_own_box = nodes.filter(g => g.dataset.cluster &&
  !inside(box(g.querySelector('rect')), boxes[g.dataset.cluster])).length;
out.unclustered_in_a_box = nodes.filter(g => !g.dataset.cluster &&
  Object.values(boxes).some(b => overlap(box(g.querySelector('rect')), b))).length;
const keys = Object.keys(boxes);
out.box_overlaps = keys.flatMap((a, i) => keys.slice(i + 1).filter(
  b => overlap(boxes[a], boxes[b])).map(b => a + '/' + b));
const rects = [...document.querySelectorAll('g.n rect, g.io rect')].map(box);
out.node_overlaps = rects.flatMap((a, i) => rects.slice(i + 1).filter(
  b => overlap(a, b))).length;
out.text_overflow = [...document.querySelectorAll('g.n text, g.io text')].filter(
  t => t.getComputedTextLength() > NODE_W - 10).map(t => t.textContent);
out.arrow_marker = !!document.querySelector('svg#graph defs marker#arrow path');
const edges = [...document.querySelectorAll('path.edge')];
out.edges = edges.length;
out.edges_with_arrow = edges.filter(
  e => e.getAttribute('marker-end') === 'url(#arrow)' && e.getTotalLength() > 0).length;
out.inputs = document.querySelectorAll('g.io.input').length;
out.outputs = document.querySelectorAll('g.io.output').length;
nodes[nodes.length - 1].dispatchEvent(new MouseEvent('click', {bubbles: true}));
out.details = document.getElementById('details').textContent;
const result = document.createElement('pre');
result.id = 'check';
result.textContent = JSON.stringify(out);
document.body.appendChild(result);
"""


def render(page, tmp_path, browser):
    """Load `page` in headless Chromium and return what CHECK_JS measured."""
    checked = page.replace("</body>", f"<script>{CHECK_JS.replace('NODE_W', str(dump_html.NODE_W))}"
                           "</script></body>")
    path = tmp_path / "page.html"
    path.write_text(checked, encoding="utf-8")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000",
           "--window-size=1400,1000", "--dump-dom", path.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r'<pre id="check">(.*?)</pre>', proc.stdout, re.DOTALL)
    assert found, f"no result from Chromium (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed "
                                               "(apt-get install chromium)")
@pytest.mark.parametrize("key", ["mixed_dynamic", "bert_no_matmul"])
def test_page_in_a_browser(key, tmp_path):
    plan = make_plan(key)
    got = render(dump.to_html(plan), tmp_path, chromium())
    names = [c.name for c in plan.clusters]
    graph = plan.graph
    assert got["legend_visible"] and got["legend_clusters"] == names
    assert got["boxes"] == names and got["labels_inside"]
    assert got["nodes"] == len(graph.nodes)
    assert got["outside_own_box"] == 0 and got["unclustered_in_a_box"] == 0
    assert got["box_overlaps"] == [] and got["node_overlaps"] == 0
    assert got["text_overflow"] == []
    assert got["arrow_marker"]
    expected_edges = len(dump_html._edges(plan, dump_html.layout(plan)))
    assert got["edges"] == got["edges_with_arrow"] == expected_edges > 0
    assert got["inputs"] == len([v for v in graph.inputs if v.name not in graph.initializers])
    assert got["outputs"] == len(graph.outputs)
    last = graph.nodes[-1]
    assert got["details"].startswith(last.name) and f"op: {last.op}" in got["details"]
