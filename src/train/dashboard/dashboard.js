// The dashboard's script: polls /api/series and /api/events, keeps the points in memory and draws every plot on its
// canvas by hand (the page loads no library: no internet at run time). Each plot's figure carries data-points (the
// points it drew) and data-state (drawn, empty, or absent: an optional plot whose metrics this run does not log),
// and the body data-polls and data-last-step, for the browser test and for anyone scripting the page.
'use strict';

const POLL_MS = 2000;
const FIRST_POINTS = 2000;  // per series on the first request (the server thins evenly)
const HEAT_POINTS = 300;    // per layer for the expert-load heat map
const KEEP_POINTS = 4000;   // per series in the page; beyond it every other point is dropped
const COLORS = ['#2f6fdf', '#e0604c', '#2aa876', '#9b59b6', '#e6a23c', '#17a2b8', '#795548', '#e83e8c'];

// What each plot shows: metric paths (a `*` segment matches any one segment), a scale for the values, and whether
// a run may lack it (then the plot hides instead of showing an empty frame).
const PLOTS = [
  {id: 'loss', title: 'Loss', series: ['train/loss', 'eval/loss'], markers: true},
  {id: 'lr', title: 'Learning rate', series: ['train/lr']},
  {id: 'grad_norm', title: 'Gradient norm', series: ['train/grad_norm']},
  {id: 'tokens_per_s', title: 'Tokens per second', series: ['train/tokens_per_s']},
  {id: 'mfu', title: 'MFU', series: ['train/mfu'], optional: true},
  {id: 'memory', title: 'Memory', note: 'GB', series: ['mem/allocated', 'mem/reserved', 'mem/peak'], scale: 1e-9},
  {id: 'layer_grad_norm', title: 'Gradient norm per layer', series: ['layer/*/grad_norm'], optional: true},
  {id: 'expert_load', title: 'Expert load per layer', note: 'load / mean: blue below, red above', heat: 'moe/load/*',
   optional: true, wide: true},
];

const store = new Map();  // metric path -> {steps: [], values: []}
// The last step each request has seen, so that the next one asks only for newer steps. Two cursors: a line logged
// between the two requests of a poll must not be skipped by the one that did not see it.
const cursor = {lines: -1, heat: -1};
let polls = 0;
let events = {events: [], alarms: {}, restarts: 0};

function matches(pattern, path) {
  const p = pattern.split('/'), s = path.split('/');
  return p.length === s.length && p.every((seg, i) => seg === '*' || seg === s[i]);
}

function seriesOf(patterns) {
  const out = [];
  for (const pattern of patterns)
    for (const path of [...store.keys()].sort())
      if (matches(pattern, path)) out.push(path);
  return out;
}

// Appends the answer's points; a step logged again (after a restart) replaces what was kept from it on. Returns the
// last step the answer covered.
function merge(answer, since) {
  for (const [path, got] of Object.entries(answer.series)) {
    if (!store.has(path)) store.set(path, {steps: [], values: []});
    const s = store.get(path);
    if (got.steps.length > 0) {
      let keep = s.steps.length;
      while (keep > 0 && s.steps[keep - 1] >= got.steps[0]) keep--;
      s.steps.length = keep;
      s.values.length = keep;
    }
    s.steps.push(...got.steps);
    s.values.push(...got.values);
    if (s.steps.length > KEEP_POINTS) {
      const last = s.steps.length - 1;
      s.steps = s.steps.filter((_, i) => i % 2 === 0 || i === last);
      s.values = s.values.filter((_, i) => i % 2 === 0 || i === last);
    }
  }
  return answer.last_step === null ? since - 1 : answer.last_step;
}

async function getJson(url) {
  const response = await fetch(url, {cache: 'no-store'});
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

function seriesUrl(patterns, since, points) {
  return `/api/series?names=${encodeURIComponent(patterns.join(','))}&since=${since}&points=${points}`;
}

function formatNumber(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return Number(v.toPrecision(3)).toString();
}

// A canvas sized to its box at the screen's pixel density, with its 2D context in CSS pixels.
function prepare(canvas, cssHeight) {
  if (cssHeight) canvas.style.height = `${cssHeight}px`;
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 400, h = canvas.clientHeight || 220;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = '11px system-ui, sans-serif';
  return {ctx, w, h};
}

function axes(ctx, box, x0, x1, y0, y1) {
  ctx.strokeStyle = '#d5d8de';
  ctx.fillStyle = '#556';
  ctx.lineWidth = 1;
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4, y = box.bottom - (box.bottom - box.top) * i / 4;
    ctx.beginPath();
    ctx.moveTo(box.left, y);
    ctx.lineTo(box.right, y);
    ctx.stroke();
    ctx.fillText(formatNumber(v), box.left - 4, y);
  }
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  for (let i = 0; i <= 4; i++) {
    const v = x0 + (x1 - x0) * i / 4, x = box.left + (box.right - box.left) * i / 4;
    ctx.fillText(String(Math.round(v)), x, box.bottom + 4);
  }
}

// Vertical lines at the steps of restarts (red) and of alarms (orange); the alarms only while few are in view (the
// banner lists them all), so that a noisy detector does not paint over the curve.
const MAX_ALARM_MARKERS = 40;
function eventMarkers(ctx, box, xOf, x0, x1) {
  const inView = events.events.filter((e) => e.alarm && e.step >= x0 && e.step <= x1);
  const alarms = inView.filter((e) => e.event !== 'restart').length;
  for (const e of inView) {
    if (e.event !== 'restart' && alarms > MAX_ALARM_MARKERS) continue;
    ctx.strokeStyle = e.event === 'restart' ? '#d9342b' : '#e6a23c';
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    ctx.moveTo(xOf(e.step), box.top);
    ctx.lineTo(xOf(e.step), box.bottom);
    ctx.stroke();
    ctx.setLineDash([]);
  }
}

function legend(fig, entries) {
  const div = fig.querySelector('.legend');
  div.replaceChildren();
  entries.forEach(([label, color]) => {
    const span = document.createElement('span');
    const swatch = document.createElement('i');
    swatch.style.background = color;
    span.append(swatch, label);
    div.append(span);
  });
}

function drawLines(fig, plot) {
  const paths = seriesOf(plot.series);
  const scale = plot.scale || 1;
  const {ctx, w, h} = prepare(fig.querySelector('canvas'));
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const path of paths) {
    const s = store.get(path);
    s.steps.forEach((step, i) => {
      const v = s.values[i];
      if (typeof v !== 'number' || !isFinite(v)) return;
      x0 = Math.min(x0, step);
      x1 = Math.max(x1, step);
      y0 = Math.min(y0, v * scale);
      y1 = Math.max(y1, v * scale);
    });
  }
  if (x0 > x1) return 0;
  if (x1 === x0) x1 = x0 + 1;
  // A margin above and below, but a series that never goes below zero keeps zero as its floor.
  const pad = (y1 - y0) * 0.05 || Math.abs(y1) * 0.05 || 1;
  y0 = y0 >= 0 ? Math.max(0, y0 - pad) : y0 - pad;
  y1 += pad;
  const box = {left: 56, right: w - 8, top: 6, bottom: h - 20};
  const xOf = (x) => box.left + (box.right - box.left) * (x - x0) / (x1 - x0);
  const yOf = (y) => box.bottom - (box.bottom - box.top) * (y - y0) / (y1 - y0);
  axes(ctx, box, x0, x1, y0, y1);
  if (plot.markers) eventMarkers(ctx, box, xOf, x0, x1);
  let drawn = 0;
  const entries = [];
  paths.forEach((path, k) => {
    const s = store.get(path), color = COLORS[k % COLORS.length];
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let open = false;
    s.steps.forEach((step, i) => {
      const v = s.values[i];
      if (typeof v !== 'number' || !isFinite(v)) {  // a non-finite value (null in the JSON) breaks the line
        open = false;
        return;
      }
      const x = xOf(step), y = yOf(v * scale);
      if (open) ctx.lineTo(x, y);
      else ctx.moveTo(x, y);
      open = true;
      drawn++;
    });
    ctx.stroke();
    if (s.steps.length === 1) ctx.fillRect(xOf(s.steps[0]) - 2, yOf(s.values[0] * scale) - 2, 4, 4);
    entries.push([path, color]);
  });
  legend(fig, entries);
  return drawn;
}

// One band per MoE layer: a row per expert, a column per logged step, coloured by the expert's load over the
// layer's mean load at that step on a log scale (x1/4 deep blue, x1 white, x4 deep red).
function drawHeat(fig, plot) {
  const layers = seriesOf([plot.heat]).filter((p) => store.get(p).values.some(Array.isArray));
  const canvas = fig.querySelector('canvas');
  if (layers.length === 0) {
    prepare(canvas);
    return 0;
  }
  const experts = Math.max(...layers.map((p) => store.get(p).values.find(Array.isArray).length));
  const rowPx = Math.max(1, Math.min(6, Math.floor(120 / experts)));
  const band = experts * rowPx + 14;
  const {ctx, w} = prepare(canvas, layers.length * band + 16);
  const left = 56, right = w - 8;
  let drawn = 0;
  layers.forEach((path, k) => {
    const s = store.get(path);
    const columns = s.values.map((v, i) => [s.steps[i], v]).filter(([, v]) => Array.isArray(v) && v.length > 0);
    const image = new ImageData(Math.max(columns.length, 1), experts);
    columns.forEach(([, loads], c) => {
      const mean = loads.reduce((a, b) => a + b, 0) / loads.length || 1;
      for (let e = 0; e < experts; e++) {
        const t = Math.max(-1, Math.min(1, Math.log2(Math.max(loads[e] || 0, 1e-9) / mean) / 2));
        const o = (e * image.width + c) * 4;
        const fade = Math.round(255 * (1 - Math.abs(t)));
        image.data[o] = t > 0 ? 220 : fade;
        image.data[o + 1] = fade;
        image.data[o + 2] = t < 0 ? 220 : fade;
        image.data[o + 3] = 255;
      }
    });
    const top = k * band + 12;
    const cells = document.createElement('canvas');
    cells.width = image.width;
    cells.height = image.height;
    cells.getContext('2d').putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(cells, left, top, right - left, experts * rowPx);
    ctx.fillStyle = '#556';
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    ctx.fillText(`layer ${parseInt(path.split('/').pop().slice(1), 10)}`, left - 4, top + experts * rowPx / 2);
    if (columns.length > 0) {
      ctx.textAlign = 'left';
      ctx.textBaseline = 'bottom';
      ctx.fillText(`steps ${columns[0][0]} to ${columns[columns.length - 1][0]}`, left, top);
    }
    drawn += columns.length;
  });
  return drawn;
}

function buildPlots() {
  const main = document.getElementById('plots');
  for (const plot of PLOTS) {
    const fig = document.createElement('figure');
    fig.className = plot.wide ? 'plot wide' : 'plot';
    fig.dataset.plot = plot.id;
    fig.dataset.points = '0';
    fig.dataset.state = plot.optional ? 'absent' : 'empty';
    const caption = document.createElement('figcaption');
    caption.textContent = plot.title;
    if (plot.note) {
      const note = document.createElement('span');
      note.className = 'note';
      note.textContent = plot.note;
      caption.append(note);
    }
    const legendDiv = document.createElement('div');
    legendDiv.className = 'legend';
    fig.append(caption, document.createElement('canvas'), legendDiv);
    main.append(fig);
  }
}

function drawPlots() {
  for (const plot of PLOTS) {
    const fig = document.querySelector(`figure[data-plot="${plot.id}"]`);
    const present = seriesOf(plot.heat ? [plot.heat] : plot.series).length > 0;
    if (!present && plot.optional) {
      fig.dataset.state = 'absent';
      fig.dataset.points = '0';
      continue;
    }
    fig.dataset.state = 'drawn';  // visible first, so that the canvas has its size
    const drawn = plot.heat ? drawHeat(fig, plot) : drawLines(fig, plot);
    fig.dataset.points = String(drawn);
    fig.dataset.state = drawn > 0 ? 'drawn' : 'empty';
  }
}

function describe(e) {
  const detail = e.detail || Object.entries(e).filter(([k]) => !['step', 'time', 'event', 'alarm'].includes(k))
                                  .map(([k, v]) => `${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`).join(' ');
  return `step ${e.step}: ${e.event}${detail ? ' — ' + detail : ''}`;
}

function drawEvents() {
  const alarms = events.events.filter((e) => e.alarm);
  const banner = document.getElementById('alarms');
  banner.dataset.count = String(alarms.length);
  banner.hidden = alarms.length === 0;
  const counts = Object.entries(events.alarms).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`);
  document.getElementById('alarm-summary').textContent = `Alarms: ${counts.join(', ')}`;
  document.getElementById('alarm-list').replaceChildren(...alarms.slice(-5).reverse().map((e) => {
    const li = document.createElement('li');
    li.textContent = describe(e);
    return li;
  }));

  const restarts = events.events.filter((e) => e.event === 'restart');
  const section = document.getElementById('restarts');
  section.dataset.count = String(events.restarts);
  section.querySelector('table').hidden = restarts.length === 0;
  document.getElementById('restart-none').hidden = restarts.length > 0;
  section.querySelector('tbody').replaceChildren(...restarts.map((e) => {
    const tr = document.createElement('tr');
    for (const v of [e.last_step ?? e.step, e.reason, e.exit_code, e.resumed_step, e.steps_lost, e.downtime_s]) {
      const td = document.createElement('td');
      td.textContent = typeof v === 'number' && !Number.isInteger(v) ? v.toFixed(1) : String(v ?? '');
      tr.append(td);
    }
    return tr;
  }));

  const list = document.querySelector('#events ol');
  document.getElementById('events').dataset.count = String(events.events.length);
  list.replaceChildren(...events.events.slice(-200).reverse().map((e) => {
    const li = document.createElement('li');
    li.textContent = describe(e);
    return li;
  }));
}

function lineNames() {
  return [...new Set(PLOTS.filter((p) => !p.heat).flatMap((p) => p.series))];
}

async function poll() {
  try {
    const heat = PLOTS.filter((p) => p.heat).map((p) => p.heat);
    const since = {lines: cursor.lines + 1, heat: cursor.heat + 1};
    const [lines, loads, evs] = await Promise.all([
      getJson(seriesUrl(lineNames(), since.lines, cursor.lines < 0 ? FIRST_POINTS : 10000)),
      getJson(seriesUrl(heat, since.heat, cursor.heat < 0 ? HEAT_POINTS : 10000)),
      getJson('/api/events'),
    ]);
    cursor.lines = merge(lines, since.lines);
    cursor.heat = merge(loads, since.heat);
    events = evs;
    drawPlots();
    drawEvents();
    polls++;
    document.body.dataset.polls = String(polls);
    document.body.dataset.lastStep = String(cursor.lines);
    document.body.dataset.state = 'live';
    document.getElementById('status').textContent =
        `step ${cursor.lines} · updated ${new Date().toLocaleTimeString()} · every ${POLL_MS / 1000} s`;
  } catch (err) {
    document.body.dataset.state = 'offline';
    document.getElementById('status').textContent = `not reachable (${err.message}); retrying`;
  }
  setTimeout(poll, POLL_MS);
}

buildPlots();
window.addEventListener('resize', drawPlots);
poll();
