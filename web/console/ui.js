// Small DOM helpers shared by the pages. Text goes in as text nodes, never as HTML.

import { Problem } from './api.js';

// h builds an element: h('button', {type: 'button', onclick: f}, 'Text', child…).
// Attributes starting with "on" become listeners; `class`, `for`, data-* and aria-*
// are set as attributes; booleans set or drop the attribute.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// replace empties el and fills it with children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

let ids = 0;
// field is a label above its control, tied by id.
export function field(label, control, hint) {
  control.id ||= `f${++ids}`;
  const hintEl = hint ? h('small', { id: `${control.id}-hint`, class: 'hint' }, hint) : null;
  if (hintEl) control.setAttribute('aria-describedby', hintEl.id);
  return h('div', { class: 'field' }, h('label', { for: control.id }, label), control, hintEl);
}

// alertBox is a live region for errors and notices.
export function alertBox() {
  return h('div', { class: 'alert', role: 'alert', hidden: true });
}

// showProblem renders err in box: a problem+json document's title, detail, each
// invalid field and the next action; any other error's message.
export function showProblem(box, err) {
  box.hidden = false;
  box.className = 'alert error';
  if (!(err instanceof Problem)) {
    replace(box, h('strong', {}, 'Error: '), err && err.message ? err.message : String(err));
    return;
  }
  const p = err.doc;
  replace(
    box,
    h('strong', {}, `${p.title || 'Error'} (${err.status})`),
    p.detail ? h('p', {}, p.detail) : null,
    Array.isArray(p.errors) && p.errors.length
      ? h('ul', { class: 'problem-fields' }, p.errors.map((e) => h('li', {}, h('code', {}, e.field), ': ', e.reason)))
      : null,
    h('p', { class: 'muted' }, p.next_action ? `Next: ${p.next_action.replace(/_/g, ' ')}. ` : '', p.request_id ? `Request ${p.request_id}` : ''),
  );
}

export function showNotice(box, ...children) {
  box.hidden = false;
  box.className = 'alert notice';
  replace(box, ...children);
}

export function clearBox(box) {
  box.hidden = true;
  box.replaceChildren();
}

// fmtEval: centipawns as pawns with a sign, mates as #n (White's view).
export function fmtEval(score) {
  if (!score) return '–';
  if (score.type === 'mate') return score.value === 0 ? '#' : `#${score.value}`;
  const p = score.value / 100;
  return `${p > 0 ? '+' : ''}${p.toFixed(2)}`;
}

// whiteShare maps a score to White's share of the evaluation bar, 0..1.
export function whiteShare(score) {
  if (!score) return 0.5;
  if (score.type === 'mate') return score.value > 0 ? 1 : score.value < 0 ? 0 : 0.5;
  return 1 / (1 + Math.exp(-0.00368208 * score.value));
}

// pawns is a score for a graph: pawns clamped to ±10, mates at the ends.
export function pawns(score) {
  if (!score) return null;
  if (score.type === 'mate') return score.value >= 0 ? 10 : -10;
  return Math.max(-10, Math.min(10, score.value / 100));
}

const compact = new Intl.NumberFormat('en', { notation: 'compact', maximumFractionDigits: 1 });
export const fmtCount = (n) => (n == null ? '–' : compact.format(n));
export const fmtInt = (n) => (n == null ? '–' : Number(n).toLocaleString('en'));
export const fmtUSD = (s) => (s == null ? '–' : `$${s}`);

// fmtTime shows an instant in the account's time zone.
export function fmtTime(iso, tz) {
  if (!iso) return '–';
  return new Intl.DateTimeFormat('en-CA', {
    timeZone: tz || 'UTC', year: 'numeric', month: '2-digit', day: '2-digit',
    hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false,
  }).format(new Date(iso));
}

// zoneOffset is tz's offset from UTC at instant ms, in ms.
function zoneOffset(ms, tz) {
  const parts = Object.fromEntries(
    new Intl.DateTimeFormat('en-US', { timeZone: tz, hourCycle: 'h23', year: 'numeric', month: 'numeric', day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric' })
      .formatToParts(new Date(ms)).map((p) => [p.type, p.value]),
  );
  const asUTC = Date.UTC(+parts.year, +parts.month - 1, +parts.day, +parts.hour, +parts.minute, +parts.second);
  return asUTC - Math.floor(ms / 1000) * 1000;
}

// dayStart is the instant the day `YYYY-MM-DD` begins in tz (daylight saving included).
export function dayStart(day, tz) {
  const [y, m, d] = day.split('-').map(Number);
  const guess = Date.UTC(y, m - 1, d);
  let t = guess - zoneOffset(guess, tz);
  t = guess - zoneOffset(t, tz);
  return new Date(t);
}

// today is the current date in tz, `YYYY-MM-DD`.
export function today(tz, minusDays = 0) {
  return new Intl.DateTimeFormat('en-CA', { timeZone: tz || 'UTC', year: 'numeric', month: '2-digit', day: '2-digit' })
    .format(new Date(Date.now() - minusDays * 86_400_000));
}

export function nextDay(day) {
  const [y, m, d] = day.split('-').map(Number);
  return new Date(Date.UTC(y, m - 1, d + 1)).toISOString().slice(0, 10);
}

// needKey is what a page shows when it needs a key and has none.
export function needKey(what) {
  return h('div', { class: 'card' },
    h('p', {}, `${what} needs an API key. Enter one above, or create an account on the `, h('a', { href: '/account', 'data-nav': '' }, 'Account'), ' page.'));
}

// chartColors reads the palette from CSS, so charts follow the stylesheet.
export function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// dataTable is a chart's data as a table, for screen readers and for the curious.
export function dataTable(caption, head, rows) {
  return h('details', { class: 'data-table' },
    h('summary', {}, `${caption}: data table`),
    h('table', {},
      h('caption', { class: 'sr-only' }, caption),
      h('thead', {}, h('tr', {}, head.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c)))))));
}
