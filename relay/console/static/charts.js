// Small SVG charts. Each is a <figure> whose SVG is described for screen readers and
// followed by the same numbers as a table, so nothing is only visible as a picture.
import { h, s, nextId } from './dom.js';

const W = 640;
const H = 220;
const PAD = { l: 52, r: 12, t: 12, b: 30 };

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

export function timeLabel(epoch, spanS) {
  const d = new Date(epoch * 1000);
  const hm = d.toISOString().slice(11, 16);
  return spanS > 2 * 86400 ? `${d.toISOString().slice(5, 10)} ${hm}` : hm;
}

function frame(title, description, svg, table) {
  const captionId = nextId('chart');
  const descId = `${captionId}-desc`;
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-labelledby', captionId);
  svg.setAttribute('aria-describedby', descId);
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('class', 'chart-svg');
  return h(
    'figure',
    { class: 'chart' },
    h('figcaption', { id: captionId }, title),
    svg,
    h('p', { id: descId, class: 'hint' }, description),
    h('details', {}, h('summary', {}, `${title}: data table`), table),
  );
}

function axes(svg, max, unit, labels) {
  const plotH = H - PAD.t - PAD.b;
  for (let i = 0; i <= 4; i += 1) {
    const value = (max * i) / 4;
    const y = PAD.t + plotH - (plotH * i) / 4;
    svg.append(s('line', { x1: PAD.l, x2: W - PAD.r, y1: y, y2: y, class: 'grid' }));
    svg.append(
      s('text', { x: PAD.l - 6, y: y + 4, 'text-anchor': 'end', class: 'tick' }, `${+value.toFixed(2)}${unit}`),
    );
  }
  const plotW = W - PAD.l - PAD.r;
  const every = Math.max(1, Math.ceil(labels.length / 6));
  labels.forEach((label, i) => {
    if (i % every) return;
    const x = PAD.l + (plotW * (i + 0.5)) / labels.length;
    svg.append(s('text', { x, y: H - 8, 'text-anchor': 'middle', class: 'tick' }, label));
  });
}

function dataTable(caption, labels, series) {
  return h(
    'table',
    {},
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'time (UTC)'), series.map((x) => h('th', { scope: 'col' }, x.name)))),
    h(
      'tbody',
      {},
      labels.map((label, i) =>
        h('tr', {}, h('th', { scope: 'row' }, label), series.map((x) => h('td', {}, x.values[i] ?? ''))),
      ),
    ),
  );
}

function legend(series, extra = []) {
  return s(
    'g',
    { class: 'legend' },
    [...series, ...extra].map((x, i) =>
      s(
        'g',
        { transform: `translate(${PAD.l + 8 + i * 120}, ${PAD.t + 4})` },
        s('rect', { width: 10, height: 10, class: `swatch ${x.cls}` }),
        s('text', { x: 14, y: 9, class: 'tick' }, x.name),
      ),
    ),
  );
}

// A threshold this many times above the data would flatten every line onto the axis (a
// 5,000 ms deadline over 20 ms searches): it is named above the plot instead of drawn.
const THRESHOLD_SCALE_LIMIT = 50;

/** Lines over time buckets; `threshold` ({value, label}) is drawn as a dashed line. */
export function lineChart({ title, description, labels, series, threshold, unit = '' }) {
  const values = series.flatMap((x) => x.values.filter((v) => v !== null && v !== undefined));
  const top = Math.max(...values, 0);
  const offScale = threshold && top > 0 && threshold.value > THRESHOLD_SCALE_LIMIT * top;
  const max = niceMax(Math.max(top, threshold && !offScale ? threshold.value * 1.05 : 0));
  const svg = s('svg', {});
  axes(svg, max, unit, labels);
  const plotW = W - PAD.l - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  const x = (i) => PAD.l + (plotW * (i + 0.5)) / labels.length;
  const y = (v) => PAD.t + plotH - (plotH * v) / max;
  if (offScale) {
    svg.append(
      s('text', { x: W - PAD.r - 4, y: PAD.t + 10, 'text-anchor': 'end', class: 'tick threshold-label' }, `${threshold.label} (far above the scale)`),
    );
  } else if (threshold) {
    svg.append(s('line', { x1: PAD.l, x2: W - PAD.r, y1: y(threshold.value), y2: y(threshold.value), class: 'threshold' }));
    svg.append(
      s('text', { x: W - PAD.r - 4, y: y(threshold.value) - 4, 'text-anchor': 'end', class: 'tick threshold-label' }, threshold.label),
    );
  }
  for (const line of series) {
    const points = line.values
      .map((v, i) => (v === null || v === undefined ? null : `${x(i)},${y(v)}`))
      .filter(Boolean);
    if (points.length) svg.append(s('polyline', { points: points.join(' '), class: `line ${line.cls}` }));
    line.values.forEach((v, i) => {
      if (v !== null && v !== undefined) svg.append(s('circle', { cx: x(i), cy: y(v), r: 2.5, class: `dot ${line.cls}` }));
    });
  }
  svg.append(legend(series));
  return frame(title, description, svg, dataTable(title, labels, series));
}

/** Stacked bars per time bucket. */
export function stackedBars({ title, description, labels, series }) {
  const totals = labels.map((_, i) => series.reduce((sum, x) => sum + (x.values[i] || 0), 0));
  const max = niceMax(Math.max(...totals, 1));
  const svg = s('svg', {});
  axes(svg, max, '', labels);
  const plotW = W - PAD.l - PAD.r;
  const plotH = H - PAD.t - PAD.b;
  const bw = Math.max(2, (plotW / labels.length) * 0.7);
  labels.forEach((_, i) => {
    let base = 0;
    for (const x of series) {
      const v = x.values[i] || 0;
      if (!v) continue;
      const top = base + v;
      svg.append(
        s('rect', {
          x: PAD.l + (plotW * (i + 0.5)) / labels.length - bw / 2,
          y: PAD.t + plotH - (plotH * top) / max,
          width: bw,
          height: (plotH * v) / max,
          class: `bar ${x.cls}`,
        }),
      );
      base = top;
    }
  });
  svg.append(legend(series));
  return frame(title, description, svg, dataTable(title, labels, series));
}

/** One row per name with two bars (e.g. unauthorized and unavailable streaks). */
export function pairedBars({ title, description, names, series, alert }) {
  const rowH = 28;
  const height = PAD.t + PAD.b + Math.max(1, names.length) * rowH;
  const max = niceMax(Math.max(1, alert || 0, ...series.flatMap((x) => x.values)));
  const left = 150;
  const plotW = W - left - PAD.r;
  const svg = s('svg', {});
  names.forEach((name, i) => {
    const top = PAD.t + i * rowH;
    svg.append(s('text', { x: left - 6, y: top + 16, 'text-anchor': 'end', class: 'tick' }, name.slice(0, 24)));
    series.forEach((x, j) => {
      const v = x.values[i] || 0;
      svg.append(s('rect', { x: left, y: top + 3 + j * 11, width: Math.max(1, (plotW * v) / max), height: 10, class: `bar ${x.cls}` }));
      svg.append(s('text', { x: left + (plotW * v) / max + 4, y: top + 12 + j * 11, class: 'tick' }, String(v)));
    });
  });
  if (alert) {
    const ax = left + (plotW * alert) / max;
    svg.append(s('line', { x1: ax, x2: ax, y1: PAD.t, y2: height - PAD.b, class: 'threshold' }));
    svg.append(s('text', { x: ax + 3, y: height - PAD.b + 14, class: 'tick threshold-label' }, `alert at ${alert}`));
  }
  const figure = frame(
    title,
    description,
    svg,
    h(
      'table',
      {},
      h('caption', {}, title),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'developer'), series.map((x) => h('th', { scope: 'col' }, x.name)))),
      h('tbody', {}, names.map((name, i) => h('tr', {}, h('th', { scope: 'row' }, name), series.map((x) => h('td', {}, x.values[i]))))),
    ),
  );
  svg.setAttribute('viewBox', `0 0 ${W} ${height}`);
  return figure;
}
