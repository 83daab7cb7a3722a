// The memory report page (memory_report.hpp). The data goes in as one JSON object; a small
// script draws it as SVG when the page loads: no library, nothing fetched. A script error is
// shown on the page (and left in body's data-errors); when everything is drawn, body's
// data-drawn lists the parts, which is what the browser test reads.
#include "loom/memory/memory_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace loom::memory {
namespace {

// The page around the data: style and script, written once.
constexpr const char* page_head = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>loom memory report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 6px; }
.note { color: #555; } svg { display: block; background: #fafafa; border: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; }
td:first-child, th:first-child { text-align: left; } tr:nth-child(even) { background: #f3f3f3; }
#errors { color: #b00; white-space: pre-wrap; } .legend span { margin-right: 14px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
</style>
</head>
<body>
<pre id="errors"></pre>
<h1 id="title"></h1>
<div class="note" id="summary"></div>
<h2>Bytes over the log</h2>
<div class="legend" id="usage-legend"></div>
<svg id="usage" width="1080" height="300"></svg>
<h2>Fragmentation over the log</h2>
<div class="note">1 &minus; largest free block / free bytes: 0 when the free memory is one block.</div>
<svg id="frag" width="1080" height="160"></svg>
<h2 id="map-title">The pool's regions</h2>
<div class="note">Each row is a region, address order left to right; each box a chunk, coloured by the
tag of the block in it (grey: free; hatched grey: free but waiting for its stream). Hover for details.</div>
<div class="legend" id="map-legend"></div>
<svg id="map" width="1080" height="40"></svg>
<h2>Allocation sites holding the most bytes</h2>
<table id="sites"><thead><tr><th>tag</th><th>bytes</th><th>share</th><th>blocks</th></tr></thead><tbody></tbody></table>
<script id="data" type="application/json">)html";

constexpr const char* page_tail = R"html(</script>
<script>
"use strict";
window.onerror = function (message, source, line) {
  document.getElementById("errors").textContent += "script error: " + message + " (line " + line + ")\n";
  document.body.dataset.errors = "yes";
};
const data = JSON.parse(document.getElementById("data").textContent);
const NS = "http://www.w3.org/2000/svg";
function el(name, attrs, parent, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i + 1 < units.length) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}
function colour(tag) {
  if (tag === null) return "#d9d9d9";
  let h = 0;
  for (const c of tag) h = (h * 31 + c.charCodeAt(0)) % 360;
  return "hsl(" + h + ", 62%, 52%)";
}
// A line chart: series [{name, colour, values}] over data.samples' events.
function chart(svg, series, format, top) {
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const L = 80, R = 16, T = 12, B = 28;
  const xs = data.samples.map(s => s[0]);
  const x0 = 0, x1 = Math.max(data.events_replayed - 1, 1);
  let ymax = top !== undefined ? top : 0;
  for (const s of series) for (const v of s.values) ymax = Math.max(ymax, v);
  if (ymax <= 0) ymax = 1;
  const X = x => L + (W - L - R) * (x - x0) / (x1 - x0), Y = y => H - B - (H - T - B) * y / ymax;
  for (let k = 0; k <= 4; k++) {
    const y = ymax * k / 4;
    el("line", {x1: L, x2: W - R, y1: Y(y), y2: Y(y), stroke: "#e4e4e4"}, svg);
    el("text", {x: L - 6, y: Y(y) + 4, "text-anchor": "end", "font-size": 11}, svg, format(y));
  }
  el("text", {x: W - R, y: H - 8, "text-anchor": "end", "font-size": 11}, svg, "event " + x1);
  el("text", {x: L, y: H - 8, "font-size": 11}, svg, "event " + x0);
  for (const s of series) {
    const points = s.values.map((v, i) => X(xs[i]).toFixed(1) + "," + Y(v).toFixed(1));
    el("polyline", {points: points.join(" "), fill: "none", stroke: s.colour, "stroke-width": 1.6,
                    "data-points": points.length}, svg);
  }
  const mark = (event, text, stroke) => {
    el("line", {x1: X(event), x2: X(event), y1: T, y2: H - B, stroke: stroke, "stroke-dasharray": "4 3"}, svg);
    const right = X(event) > W - 140;  // near the right edge: the label goes to the left
    el("text", {x: X(event) + (right ? -4 : 4), y: T + 12, fill: stroke, "font-size": 11,
                "text-anchor": right ? "end" : "start"}, svg, text);
  };
  if (data.failure) mark(data.failure.event, "first failure", "#c00");
  else mark(data.at_event, "peak", "#555");
}
function legend(id, series) {
  const box = document.getElementById(id);
  for (const s of series) {
    const span = document.createElement("span");
    span.innerHTML = '<i class="swatch" style="background:' + s.colour + '"></i>';
    span.appendChild(document.createTextNode(s.name));
    box.appendChild(span);
  }
}
function draw() {
  document.getElementById("title").textContent = data.title;
  const f = data.failure;
  document.getElementById("summary").textContent =
    data.resource + ". " + data.events_replayed + " of " + data.events_total + " events replayed; peak " +
    bytes(data.peak_bytes_in_use) + " in use at event " + data.peak_event + ", " +
    bytes(data.peak_bytes_reserved) + " reserved at most." +
    (f ? " The replay failed at event " + f.event + ": " + f.description : "");
  const usage = [
    {name: "bytes in use", colour: "#1f77b4", values: data.samples.map(s => s[1])},
    {name: "bytes reserved", colour: "#ff7f0e", values: data.samples.map(s => s[2])},
    {name: "largest free block", colour: "#2ca02c", values: data.samples.map(s => s[3])}];
  legend("usage-legend", usage);
  chart(document.getElementById("usage"), usage, bytes);
  chart(document.getElementById("frag"),
        [{name: "fragmentation", colour: "#9467bd", values: data.samples.map(s => s[4])}],
        v => v.toFixed(2), 1);
  // The map: one row per region, chunks as boxes of width proportional to their size.
  const map = document.getElementById("map");
  document.getElementById("map-title").textContent =
    "The pool's regions at " + (data.at_failure ? "the first failure" : "the peak") + " (event " + data.at_event + ")";
  const W = +map.getAttribute("width"), rowH = 26, gap = 8, L = 80;
  map.setAttribute("height", Math.max(40, data.regions.length * (rowH + gap) + gap));
  const defs = el("defs", {}, map);
  const pat = el("pattern", {id: "pending", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                             patternTransform: "rotate(45)"}, defs);
  el("rect", {width: 6, height: 6, fill: "#d9d9d9"}, pat);
  el("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#aaa", "stroke-width": 3}, pat);
  const used = new Map();
  data.regions.forEach((r, i) => {
    const y = gap + i * (rowH + gap);
    el("text", {x: L - 6, y: y + rowH / 2 + 4, "text-anchor": "end", "font-size": 11}, map, bytes(r.size));
    for (const c of r.chunks) {
      const [offset, size, inUse, tag, requested, pending] = c;
      const name = tag >= 0 ? data.tags[tag] : null;
      if (inUse) used.set(name, colour(name));
      const x = L + (W - L - 8) * offset / r.size, w = Math.max(0.5, (W - L - 8) * size / r.size);
      const box = el("rect", {x: x, y: y, width: w, height: rowH, stroke: "#fff", "stroke-width": 0.3,
                              fill: inUse ? colour(name) : (pending ? "url(#pending)" : "#d9d9d9")}, map);
      el("title", {}, box, (inUse ? (name || "untagged") + ": " + bytes(requested) + " asked, " : "free: ") +
         bytes(size) + " at offset " + offset);
    }
  });
  legend("map-legend", [...used].slice(0, 12).map(([name, c]) => ({name: name || "untagged", colour: c})));
  const body = document.querySelector("#sites tbody");
  const total = data.sites.reduce((a, s) => a + s.bytes, 0) || 1;
  for (const s of data.sites) {
    const tr = document.createElement("tr");
    for (const v of [s.tag || "untagged", bytes(s.bytes), (100 * s.bytes / total).toFixed(1) + "%", s.blocks]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  document.body.dataset.drawn = "usage frag map sites";
}
draw();
</script>
</body>
</html>
)html";

}  // namespace

std::string to_html(const memory_picture& picture) {
  using nlohmann::json;
  const replay_report& r = picture.report;
  json samples = json::array();
  for (const replay_sample& s : r.samples) {
    samples.push_back({s.event, s.bytes_in_use, s.bytes_reserved, s.largest_free_block,
                       s.fragmentation});
  }
  // Tags of the live blocks, by address, and the sites table.
  std::vector<std::string> tags;
  std::unordered_map<std::string, int> tag_index;
  std::unordered_map<std::uintptr_t, int> tag_at;
  std::map<std::string, std::pair<std::size_t, std::size_t>> sites;  // tag -> (bytes, blocks)
  for (const replay_block& b : picture.blocks) {
    auto [it, fresh] = tag_index.try_emplace(b.tag, static_cast<int>(tags.size()));
    if (fresh) tags.push_back(b.tag);
    tag_at[reinterpret_cast<std::uintptr_t>(b.pointer)] = it->second;
    auto& site = sites[b.tag];
    site.first += b.bytes;
    site.second += 1;
  }
  json regions = json::array();
  for (const region_info& region : picture.regions) {
    json chunks = json::array();
    const auto base = reinterpret_cast<std::uintptr_t>(region.base);
    for (const chunk_info& c : region.chunks) {
      const auto found = c.in_use ? tag_at.find(base + c.offset) : tag_at.end();
      chunks.push_back({c.offset, c.size, c.in_use ? 1 : 0,
                        found == tag_at.end() ? -1 : found->second, c.requested,
                        c.needs_sync ? 1 : 0});
    }
    regions.push_back({{"size", region.size}, {"chunks", std::move(chunks)}});
  }
  std::vector<std::pair<std::string, std::pair<std::size_t, std::size_t>>> ranked(sites.begin(),
                                                                                  sites.end());
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  if (ranked.size() > 20) ranked.resize(20);
  json site_rows = json::array();
  for (const auto& [tag, v] : ranked) {
    site_rows.push_back({{"tag", tag}, {"bytes", v.first}, {"blocks", v.second}});
  }
  json failure = nullptr;
  if (r.first_failure) {
    failure = {{"event", r.first_failure->event}, {"description", r.first_failure->describe()}};
  }
  const json data = {{"title", picture.title},
                     {"resource", picture.resource},
                     {"events_total", r.events_total},
                     {"events_replayed", r.events_replayed},
                     {"peak_bytes_in_use", r.peak_bytes_in_use},
                     {"peak_event", r.peak_in_use_event},
                     {"peak_bytes_reserved", r.peak_bytes_reserved},
                     {"at_event", picture.at_event},
                     {"at_failure", picture.at_failure},
                     {"samples", std::move(samples)},
                     {"failure", std::move(failure)},
                     {"tags", tags},
                     {"regions", std::move(regions)},
                     {"sites", std::move(site_rows)}};
  // "</" cannot appear inside a script element: JSON lets it be written "<\/".
  std::string text = data.dump();
  std::string safe;
  safe.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '/') {
      safe += "<\\/";
      ++i;
    } else {
      safe += text[i];
    }
  }
  return std::string(page_head) + safe + page_tail;
}

}  // namespace loom::memory
