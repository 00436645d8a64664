// Usage: charts by day and by key (GET /usage in the account's time zone), what is left
// of the budgets (GET /me), and the statement with its line items (GET /usage/charges),
// both downloadable as CSV. All of it is the calling key's book (its env), as the
// statement is: GET /usage answers the key's own env; the page groups by env too and
// keeps the key's own (an answer of an older server had both books).

import { api, session, me, download } from './api.js';
import { chart } from './charts.js';
import { h, replace, field, alertBox, showProblem, clearBox, needKey, fmtTime, fmtUSD, fmtInt, today, dayStart, nextDay, dataTable, cssVar } from './ui.js';

export const title = 'Usage';

export function mount(root) {
  if (!session.key) {
    replace(root, h('h1', {}, 'Usage'), needKey('Usage'));
    return null;
  }
  const problems = alertBox();
  const fromIn = h('input', { type: 'date', name: 'from' });
  const toIn = h('input', { type: 'date', name: 'to' });
  const tzNote = h('p', { class: 'muted', 'data-testid': 'usage-tz' });
  const budgetsEl = h('div', { class: 'budgets', 'data-testid': 'budgets' });
  const dayCanvas = h('canvas', { role: 'img', 'aria-label': 'Units charged by day', 'data-testid': 'usage-by-day' });
  const keyCanvas = h('canvas', { role: 'img', 'aria-label': 'Units charged by key', 'data-testid': 'usage-by-key' });
  const dayTable = h('div', { 'data-testid': 'usage-day-table' });
  const keyTable = h('div', { 'data-testid': 'usage-key-table' });
  const totalsEl = h('p', { 'data-testid': 'usage-totals' });
  const keyFilter = h('select', { name: 'key_id' }, h('option', { value: '' }, 'all keys'));
  const endpointFilter = h('select', { name: 'endpoint' }, ['', 'eval', 'bestmove', 'analyze', 'batch'].map((e) => h('option', { value: e }, e || 'all endpoints')));
  const stmtBody = h('tbody', { 'data-testid': 'statement' });
  const stmtTotals = h('p', { 'data-testid': 'statement-totals' });
  const pager = h('div', { class: 'row' });
  let tz = 'UTC';
  let env = 'live'; // the calling key's env: the book shown
  let labels = {};
  const charts = {}; // by canvas: drawn again on each refresh
  let closed = false;
  let cursors = [null]; // the statement's pages seen: cursor of each

  replace(root,
    h('h1', {}, 'Usage'),
    problems,
    h('form', { class: 'row card', onsubmit: (e) => { e.preventDefault(); cursors = [null]; refresh(); } },
      field('From', fromIn), field('To', toIn), h('button', { type: 'submit' }, 'Show'), tzNote),
    h('section', { class: 'card', 'aria-labelledby': 'u-budgets' }, h('h2', { id: 'u-budgets' }, 'Budgets and allowance'), budgetsEl),
    h('div', { class: 'grid2' },
      h('section', { class: 'card', 'aria-labelledby': 'u-day' },
        h('div', { class: 'row spread' }, h('h2', { id: 'u-day' }, 'By day'),
          h('button', { type: 'button', class: 'small', onclick: () => csv('/usage', { group_by: 'env,day', ...range() }, 'usage-by-day') }, 'Download CSV')),
        h('div', { class: 'chart' }, dayCanvas), dayTable),
      h('section', { class: 'card', 'aria-labelledby': 'u-key' },
        h('h2', { id: 'u-key' }, 'By key'), h('div', { class: 'chart' }, keyCanvas), keyTable)),
    totalsEl,
    h('section', { class: 'card', 'aria-labelledby': 'u-stmt' },
      h('div', { class: 'row spread' }, h('h2', { id: 'u-stmt' }, 'Statement'),
        h('button', { type: 'button', class: 'small', 'data-testid': 'statement-csv', onclick: () => csv('/usage/charges', statementQuery(null, 1000), 'statement') }, 'Download CSV')),
      h('div', { class: 'row' }, field('Key', keyFilter), field('Endpoint', endpointFilter)),
      h('div', { class: 'scroll' }, h('table', { class: 'statement' },
        h('thead', {}, h('tr', {}, ['Charged', 'Endpoint', 'Key', 'Depth', 'MultiPV', 'Positions', 'Cached', 'Units', 'USD', 'Request', 'Credit'].map((c) => h('th', { scope: 'col' }, c)))),
        stmtBody)),
      stmtTotals,
      pager));
  for (const f of [keyFilter, endpointFilter]) f.addEventListener('change', () => { cursors = [null]; statement(0); });

  init();

  async function init() {
    try {
      const m = await me({ fresh: true });
      tz = m.timezone || 'UTC';
      env = m.key.env;
      toIn.value = today(tz);
      fromIn.value = today(tz, 29);
      tzNote.textContent = `The ${env} book (this key's env). Days and times in the account's time zone, ${tz}.`;
      if (m.key.scopes.includes('keys:write')) {
        const ks = await api('GET', '/keys');
        labels = Object.fromEntries(ks.keys.map((k) => [k.key_id, k.label || k.prefix]));
      }
      for (const k of m.key_spend || []) keyFilter.append(h('option', { value: k.key_id }, labels[k.key_id] || k.key_id));
      budgets(m);
      await refresh();
    } catch (err) {
      showProblem(problems, err);
    }
  }

  const range = () => ({ tz, from: fromIn.value || undefined, to: toIn.value || undefined });

  async function refresh() {
    if (closed) return;
    clearBox(problems);
    try {
      const [byDay, byKey, byEnv] = await Promise.all([
        usageGroups({ group_by: 'env,day', ...range() }),
        usageGroups({ group_by: 'env,key', ...range() }),
        usageGroups({ group_by: 'env', ...range() }),
      ]);
      if (closed) return;
      drawDays(byDay);
      drawKeys(byKey);
      const t = byEnv.groups[0] || { calls: 0, units: 0, usd: '0.000000' };
      replace(totalsEl, `${byDay.from} to ${byDay.to}, ${env}: `, h('strong', { 'data-testid': 'usage-calls' }, `${fmtInt(t.calls)} calls`),
        `, ${fmtInt(t.units)} units (${fmtUSD(t.usd)})`, t.credits ? `; credited ${fmtInt(t.credited_units)} units, net ${fmtUSD(t.net_usd)}` : '', '.');
      await statement(0);
    } catch (err) {
      showProblem(problems, err);
    }
  }

  // usageGroups is GET /usage's groups of the key's env, every page of them (the totals
  // are not used: an older server's had both books for a live key).
  async function usageGroups(query) {
    const groups = [];
    let res;
    let cursor;
    do {
      res = await api('GET', '/usage', { query: { ...query, cursor } });
      groups.push(...res.groups.filter((g) => g.env === env));
      cursor = res.next_cursor;
    } while (cursor && !closed);
    return { ...res, groups };
  }

  function draw(canvas, config) {
    charts[canvas.dataset.testid]?.destroy();
    charts[canvas.dataset.testid] = chart(canvas, config);
  }

  // every day of the range, with zeros, so the chart reads as a calendar
  function days(from, to) {
    const out = [];
    for (let d = from; d <= to && out.length < 400; d = nextDay(d)) out.push(d);
    return out;
  }

  function drawDays(res) {
    const byDay = Object.fromEntries(res.groups.map((g) => [g.day, g]));
    const all = days(res.from, res.to);
    draw(dayCanvas, {
      type: 'bar',
      data: {
        labels: all.map((d) => d.slice(5)),
        datasets: [{ label: 'Units', data: all.map((d) => byDay[d]?.units || 0), backgroundColor: cssVar('--accent') }],
      },
      options: { plugins: { legend: { display: false } }, scales: { y: { beginAtZero: true, title: { display: true, text: 'units' } } } },
    });
    replace(dayTable, dataTable('Usage by day', ['Day', 'Calls', 'Units', 'USD'],
      res.groups.map((g) => [g.day, g.calls, g.units, g.usd])));
  }

  function drawKeys(res) {
    draw(keyCanvas, {
      type: 'bar',
      data: {
        labels: res.groups.map((g) => labels[g.key] || g.key),
        datasets: [{ label: 'Units', data: res.groups.map((g) => g.units), backgroundColor: cssVar('--accent-2') }],
      },
      options: { indexAxis: 'y', plugins: { legend: { display: false } }, scales: { x: { beginAtZero: true } } },
    });
    replace(keyTable, dataTable('Usage by key', ['Key', 'Calls', 'Units', 'USD'],
      res.groups.map((g) => [labels[g.key] ? `${labels[g.key]} (${g.key})` : g.key, g.calls, g.units, g.usd])));
  }

  // statementQuery bounds the statement by the same days as the charts, in tz.
  function statementQuery(cursor, limit = 25) {
    const q = { limit, cursor: cursor || undefined, key_id: keyFilter.value || undefined, endpoint: endpointFilter.value || undefined };
    if (fromIn.value) q.from = dayStart(fromIn.value, tz).toISOString();
    if (toIn.value) q.to = dayStart(nextDay(toIn.value), tz).toISOString();
    return q;
  }

  async function statement(page) {
    try {
      const res = await api('GET', '/usage/charges', { query: statementQuery(cursors[page]) });
      if (closed) return;
      replace(stmtBody, res.charges.map((c) => h('tr', { 'data-charge-id': c.charge_id },
        h('td', {}, fmtTime(c.charged_at, tz)), h('td', {}, c.endpoint), h('td', {}, labels[c.key_id] || c.key_id),
        h('td', {}, c.depth), h('td', {}, c.multipv), h('td', {}, c.positions), h('td', {}, c.cached ? 'yes' : 'no'),
        h('td', {}, fmtInt(c.units)), h('td', {}, c.usd), h('td', {}, h('code', {}, c.job_id || c.request_id)),
        h('td', {}, c.credit_id ? `credited ${fmtTime(c.credited_at, tz)}: ${c.credit_reason}` : ''))));
      if (!res.charges.length) stmtBody.append(h('tr', {}, h('td', { colspan: 11, class: 'muted' }, 'No charges in this range.')));
      replace(stmtTotals, `Total: ${fmtInt(res.total_calls)} charges, ${fmtInt(res.total_units)} units (${fmtUSD(res.total_usd)})`,
        res.total_credits ? `; credited ${fmtInt(res.total_credited_units)} units, net ${fmtUSD(res.total_net_usd)}` : '', '.');
      cursors[page + 1] = res.next_cursor;
      replace(pager,
        page > 0 ? h('button', { type: 'button', class: 'small', onclick: () => statement(page - 1) }, 'Previous page') : null,
        res.next_cursor ? h('button', { type: 'button', class: 'small', onclick: () => statement(page + 1) }, 'Next page') : null);
    } catch (err) {
      showProblem(problems, err);
    }
  }

  // meterRow shows spend against a limit; a limit of 0 is a budget (every costed call
  // refused), only null is none.
  function meterRow(name, spent, limit, remaining, unit, extra) {
    const m = limit > 0 ? h('meter', { min: 0, max: limit, value: Math.min(spent, limit), low: limit * 0.5, high: limit * 0.8, optimum: 0 }) : null;
    return h('tr', {}, h('th', { scope: 'row' }, name), h('td', {}, m), h('td', {},
      limit != null ? `${fmtInt(spent)} of ${fmtInt(limit)} ${unit}; left ${fmtInt(remaining)}` : `${fmtInt(spent)} ${unit}, no budget`, extra ? h('small', { class: 'muted' }, ` ${extra}`) : null));
  }

  function budgets(m) {
    const rows = [];
    if (m.today) rows.push(meterRow(`Today's allowance (${m.plan} plan)`, m.today.units + (m.today.held_units || 0), m.today.allowance_units, m.today.remaining_units, 'units'));
    const b = m.budget;
    if (b && (b.budget_units != null || b.budget_usd != null)) {
      const per = b.budget_period === 'total' ? '' : `this ${b.budget_period}, ends ${fmtTime(b.period_end, tz)}`;
      if (b.budget_units != null) rows.push(meterRow('Account budget', b.period_spent_units + (b.held_units || 0), b.budget_units, b.remaining_units, 'units', per));
      if (b.budget_usd != null) rows.push(h('tr', {}, h('th', { scope: 'row' }, 'Account budget (USD)'), h('td'), h('td', {}, `${fmtUSD(b.period_spent_usd)} of ${fmtUSD(b.budget_usd)}; left ${fmtUSD(b.remaining_usd)}`)));
    } else {
      rows.push(h('tr', {}, h('th', { scope: 'row' }, 'Account budget'), h('td'), h('td', {}, 'none (set one on the Account page)')));
    }
    for (const k of m.key_spend || []) {
      const name = `Key ${labels[k.key_id] || k.key_id}`;
      const per = k.budget_period && k.budget_period !== 'total' ? `this ${k.budget_period}` : '';
      const spent = (k.budget_period === 'total' ? k.spent_units : k.period_spent_units ?? k.spent_units) + (k.held_units || 0);
      rows.push(meterRow(name, spent, k.budget_units, k.remaining_units, 'units', [per, k.budget_usd != null ? `USD left ${fmtUSD(k.remaining_usd)} of ${fmtUSD(k.budget_usd)}` : ''].filter(Boolean).join('; ')));
    }
    replace(budgetsEl, h('div', { class: 'scroll' }, h('table', { class: 'budget-table' }, h('tbody', {}, rows))));
  }

  async function csv(path, query, name) {
    clearBox(problems);
    try {
      await download(path, query, `chessd-${name}-${fromIn.value}-${toIn.value}.csv`);
    } catch (err) {
      showProblem(problems, err);
    }
  }

  return () => {
    closed = true;
    for (const c of Object.values(charts)) c.destroy();
  };
}
