// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
//
// The style sheet and script inlined into every HTML report. The page works without the
// script (the charts are pre-rendered SVG); the script adds the hover readout on timelines and
// lets the legend hide and show series. Nothing here may refer to anything outside the page.
#pragma once

namespace cistern::cli::html_assets {

inline constexpr const char* kStyle = R"CSS(
:root { --fg: #1f2937; --muted: #6b7280; --line: #e5e7eb; --bg: #ffffff; --panel: #f9fafb; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; color: var(--fg); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1160px; margin: 0 auto; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 40px 0 2px; padding-top: 16px; border-top: 2px solid var(--line);
  word-break: break-all; }
h3 { font-size: 14px; margin: 22px 0 6px; }
.meta { color: var(--muted); margin: 0 0 10px; }
.meta b { color: var(--fg); font-weight: 600; }
code, .num { font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; margin: 6px 0 4px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { font-weight: 600; color: var(--muted); font-size: 12px; text-transform: none; }
th:first-child, td:first-child { text-align: left; }
td.best { font-weight: 700; }
tr.recorded td { color: #4b5563; font-style: italic; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 6px;
  vertical-align: -1px; }
.swatch.dash { height: 0; border-top: 3px dashed; border-radius: 0; vertical-align: 3px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 18px; margin: 8px 0 2px; font-size: 13px; }
.legend span.item { cursor: pointer; user-select: none; }
.legend span.off { opacity: 0.35; }
.chart { position: relative; }
.chart svg { display: block; }
.axis text { font-size: 11px; fill: var(--muted); }
.axis line.grid { stroke: var(--line); }
.axis path, .axis line.tick { stroke: #9ca3af; }
.tip { position: absolute; pointer-events: none; background: rgba(255,255,255,0.96);
  border: 1px solid #d1d5db; border-radius: 4px; padding: 6px 8px; font-size: 12px;
  box-shadow: 0 2px 6px rgba(0,0,0,0.12); display: none; white-space: nowrap; z-index: 10; }
.tip td { border: 0; padding: 1px 4px; }
.segmap { margin: 4px 0 14px; }
.segmap .title { font-size: 13px; margin: 10px 0 4px; }
.segmap .title b { font-weight: 600; }
.segmap .map { position: relative; }
.segmap rect.a { fill: #3b82f6; } .segmap rect.p { fill: #f59e0b; } .segmap rect.f { fill: #fca5a5; }
.segmap rect.s { fill: #ffffff; } .segmap rect.b { fill: rgba(255,255,255,0.6); }
.segmap rect.hl { fill: none; stroke: #111827; stroke-width: 1.5; display: none; }
.swatch.a { background: #3b82f6; } .swatch.p { background: #f59e0b; } .swatch.f { background: #fca5a5; }
.keys { font-size: 12px; color: var(--muted); display: flex; gap: 16px; margin: 4px 0; }
.note { color: var(--muted); font-size: 13px; max-width: 900px; }
.err { color: #b91c1c; }
nav table td a { color: inherit; }
nav table th { white-space: normal; max-width: 160px; overflow-wrap: anywhere; vertical-align: bottom; }
.peak .title { font-size: 13px; margin: 10px 0 4px; }
table.largest td.frames { text-align: left; white-space: normal; font-size: 12px; }
table.largest td.frames div { overflow-wrap: anywhere; }
table.largest details summary { cursor: pointer; color: var(--muted); }
.moment { margin: 14px 0 4px; padding: 8px 10px; background: var(--panel);
  border: 1px solid var(--line); border-radius: 4px; }
.moment input[type=range] { width: 60%; vertical-align: middle; }
.moment .readout { font-size: 13px; margin: 6px 0 2px; }
)CSS";

inline constexpr const char* kScript = R"JS(
(function () {
  function fmtBytes(b) {
    if (b < 1024) return b + ' bytes';
    var u = ['KiB', 'MiB', 'GiB', 'TiB'], v = b / 1024, i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return v.toFixed(2) + ' ' + u[i];
  }
  // The last sample at or before event e (memory holds its value until the next sample).
  function valueAt(xs, ys, e) {
    var lo = 0, hi = xs.length - 1;
    if (hi < 0 || e < xs[0]) return null;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (xs[mid] <= e) lo = mid; else hi = mid - 1; }
    return ys[lo];
  }
  document.querySelectorAll('.chart').forEach(function (chart) {
    var data = JSON.parse(document.getElementById(chart.dataset.src).textContent);
    var svg = chart.querySelector('svg'), tip = chart.querySelector('.tip');
    var guide = svg.querySelector('.guide');
    var hidden = {};
    chart.parentNode.querySelectorAll('.legend .item').forEach(function (item) {
      item.addEventListener('click', function () {
        var k = item.dataset.series, off = !hidden[k];
        hidden[k] = off;
        item.classList.toggle('off', off);
        svg.querySelectorAll('[data-series="' + k + '"]').forEach(function (el) {
          el.style.display = off ? 'none' : '';
        });
      });
    });
    svg.addEventListener('mousemove', function (ev) {
      var box = svg.getBoundingClientRect();
      var px = (ev.clientX - box.left) * (data.width / box.width);
      if (px < data.left || px > data.left + data.plotWidth) { hide(); return; }
      var e = Math.round((px - data.left) / data.plotWidth * data.xmax);
      guide.setAttribute('x1', px); guide.setAttribute('x2', px);
      guide.style.display = '';
      var rows = '<tr><td colspan="2"><b>event ' + e.toLocaleString() + '</b></td></tr>';
      data.series.forEach(function (s, i) {
        if (hidden[i]) return;
        var v = valueAt(data.xs[s.xi], s.y, e);
        if (v === null) return;
        rows += '<tr><td><span class="swatch" style="background:' + s.color + '"></span>' +
                s.name + '</td><td style="text-align:right">' + fmtBytes(v) + '</td></tr>';
      });
      tip.innerHTML = '<table>' + rows + '</table>';
      tip.style.display = 'block';
      var x = ev.clientX - chart.getBoundingClientRect().left;
      var w = tip.offsetWidth;
      tip.style.left = (x + 14 + w > chart.clientWidth ? x - 14 - w : x + 14) + 'px';
      tip.style.top = '8px';
    });
    function hide() { tip.style.display = 'none'; guide.style.display = 'none'; }
    svg.addEventListener('mouseleave', hide);
  });
  // Segment maps: find the piece under the mouse in the map's list (sorted by position).
  var STATES = ['allocated', 'pending free', 'free (cached)'];
  function hex(n) { return '0x' + n.toString(16); }
  function describe(item, segments) {
    if (item[2] === 3)
      return '<b>' + item[4] + ' small blocks</b><br>allocated ' + fmtBytes(item[5]) +
             '<br>pending free ' + fmtBytes(item[6]) + '<br>free (cached) ' + fmtBytes(item[7]);
    var seg = segments[item[6]];
    var text = '<b>' + STATES[item[2]] + '</b> block at ' + hex(seg[0] + item[3]) + '<br>size ' +
               fmtBytes(item[4]) + ' (' + item[4].toLocaleString() + ' bytes)';
    if (item[2] !== 2) text += '<br>requested ' + fmtBytes(item[5]) + ' (' +
                               item[5].toLocaleString() + ' bytes)';
    return text + '<br>segment ' + hex(seg[0]) + ', ' + fmtBytes(seg[1]) + ', ' +
           (seg[2] ? 'large' : 'small') + ' pool' + (seg[3] ? ', expandable' : '');
  }
  document.querySelectorAll('.segmap[data-src]').forEach(function (map) {
    var data = JSON.parse(document.getElementById(map.dataset.src).textContent);
    var box = map.querySelector('.map'), svg = box.querySelector('svg');
    var tip = box.querySelector('.tip'), hl = svg.querySelector('.hl');
    var items = data.items, pitch = data.rowHeight + data.rowGap;
    function hide() { tip.style.display = 'none'; hl.style.display = 'none'; }
    svg.addEventListener('mouseleave', hide);
    svg.addEventListener('mousemove', function (ev) {
      var r = svg.getBoundingClientRect(), k = data.width / r.width;
      var x = (ev.clientX - r.left) * k, y = (ev.clientY - r.top) * k;
      var row = Math.floor(y / pitch);
      if (y - row * pitch > data.rowHeight) { hide(); return; }
      var at = row * data.width + x, lo = 0, hi = items.length - 1;
      while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (items[mid][0] <= at) lo = mid; else hi = mid - 1; }
      var item = items[lo];
      if (!item || at < item[0] || at > item[1] + 0.05) { hide(); return; }
      var startRow = Math.floor(item[0] / data.width + 1e-9);
      var x0 = item[0] - startRow * data.width;
      hl.setAttribute('x', x0); hl.setAttribute('y', startRow * pitch);
      hl.setAttribute('width', Math.max(1, Math.min(item[1] - item[0], data.width - x0)));
      hl.setAttribute('height', data.rowHeight);
      hl.style.display = 'block';
      tip.innerHTML = describe(item, data.segments);
      tip.style.display = 'block';
      var cx = ev.clientX - box.getBoundingClientRect().left, w = tip.offsetWidth;
      tip.style.left = (cx + 14 + w > box.clientWidth ? cx - 14 - w : cx + 14) + 'px';
      tip.style.top = ((row + 1) * pitch / k + 4) + 'px';
    });
  });
  // Where the memory went: the slider picks a timeline point; the panel shows the largest live
  // allocations there with their frames, and a line marks the moment on the timeline.
  function escHtml(t) {
    return String(t).replace(/[&<>"']/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
    });
  }
  function frameHtml(f) {
    return '<div><b>' + escHtml(f[2]) + '</b> <span class="note">' + escHtml(f[0]) + ':' + f[1] +
           '</span></div>';
  }
  // As the page's own tables: the innermost Python frames (else the innermost), then all.
  function framesHtml(frames) {
    if (!frames) return '<span class="note">no frames recorded</span>';
    var shown = frames.filter(function (f) { return /\.py$/.test(f[0]); }).slice(0, 3);
    if (!shown.length) shown = frames.slice(0, 3);
    var out = shown.map(frameHtml).join('');
    if (frames.length <= shown.length) return out;
    return out + '<details><summary>all ' + frames.length + ' frames</summary>' +
           frames.map(frameHtml).join('') + '</details>';
  }
  document.querySelectorAll('.moment[data-src]').forEach(function (panel) {
    var data = JSON.parse(document.getElementById(panel.dataset.src).textContent);
    var slider = panel.querySelector('input'), readout = panel.querySelector('.readout');
    var list = panel.querySelector('.list'), line = null, chart = null;
    var source = document.getElementById(panel.dataset.timeline);
    if (source) {
      chart = JSON.parse(source.textContent);
      var svg = document.querySelector('.chart[data-src="' + panel.dataset.timeline + '"] svg');
      if (svg) {
        line = document.createElementNS(svg.namespaceURI, 'line');
        var guide = svg.querySelector('.guide');
        line.setAttribute('y1', guide.getAttribute('y1'));
        line.setAttribute('y2', guide.getAttribute('y2'));
        line.setAttribute('stroke', '#dc2626');
        line.setAttribute('stroke-width', '1');
        svg.appendChild(line);
      }
    }
    function show() {
      var i = Number(slider.value), m = data.moments[i];
      var text = '<b>after event ' + m.event.toLocaleString() + '</b>: live ' + fmtBytes(m.live);
      data.policies.forEach(function (p) {
        text += ' &middot; <span class="swatch" style="background:' + p.color + '"></span>' +
                escHtml(p.name) + ' reserved ' + fmtBytes(p.reserved[i]) +
                (p.peakEvent === m.event ? ' (its peak)' : '');
      });
      readout.innerHTML = text;
      var rows = '<tr><th>size</th><th>allocation</th><th>where (innermost frame first)</th></tr>';
      m.largest.forEach(function (a) {
        rows += '<tr><td>' + fmtBytes(a[0]) + '</td><td>#' + a[1] + '</td><td class="frames">' +
                framesHtml(a[2] >= 0 ? data.stacks[a[2]] : null) + '</td></tr>';
      });
      list.innerHTML = '<table class="largest">' + rows + '</table>';
      if (line && chart) {
        var x = chart.left + m.event / chart.xmax * chart.plotWidth;
        line.setAttribute('x1', x); line.setAttribute('x2', x);
      }
    }
    slider.addEventListener('input', show);
    show();
  });
})();
)JS";

}  // namespace cistern::cli::html_assets
