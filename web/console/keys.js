// Keys: list, create (the secret shown once), change label, scopes and budget, rotate,
// revoke. The API decides what the current key may do; its refusals are shown as they
// come (problem+json), never second-guessed here.

import { api, session, me } from './api.js';
import { h, replace, field, alertBox, showProblem, showNotice, clearBox, needKey, fmtTime, fmtUSD, fmtInt } from './ui.js';

export const title = 'Keys';

const SCOPES = ['eval', 'jobs', 'usage:read', 'keys:write', 'billing'];

// carried is a secret to show on the next mount, once: the key in use rotated with no
// grace, whose new secret the console switched to (which mounts the page afresh). Kept
// in memory only, never in storage.
let carried = null;

export function mount(root) {
  if (!session.key) {
    replace(root, h('h1', {}, 'Keys'), needKey('Managing keys'));
    return null;
  }
  const problems = alertBox();
  const secretBox = h('div', { class: 'secret', hidden: true, 'data-testid': 'secret-box' });
  const envSel = h('select', { name: 'env-view' }, h('option', { value: 'live' }, 'live'), h('option', { value: 'test' }, 'test'));
  const tbody = h('tbody', { 'data-testid': 'keys' });
  const dialog = h('dialog', { class: 'dialog', 'aria-labelledby': 'dialog-title' });
  let tz = 'UTC';
  let keys = [];
  let closed = false;
  // myKeyID is the key in use, by GET /me: a rotation with grace changes the listed
  // prefix while this console still holds the old secret, so the prefix cannot tell.
  let myKeyID = null;
  const isSelf = (k) => (myKeyID ? k.key_id === myKeyID : session.key.startsWith(k.prefix));

  // the create form
  const label = h('input', { type: 'text', name: 'label', maxlength: 100, 'data-testid': 'new-label' });
  const scopeBoxes = SCOPES.map((s) => h('input', { type: 'checkbox', name: 'scopes', value: s, checked: s === 'eval' }));
  const budgetUnits = h('input', { type: 'number', name: 'budget_units', min: 0, step: 1, placeholder: 'none', 'data-testid': 'new-budget-units' });
  const budgetUSD = h('input', { type: 'text', name: 'budget_usd', inputmode: 'decimal', placeholder: 'none' });
  const period = periodSelect('total');
  const env = h('select', { name: 'env' }, h('option', { value: '' }, 'same as this key'), h('option', { value: 'live' }, 'live'), h('option', { value: 'test' }, 'test'));

  replace(root,
    h('h1', {}, 'Keys'),
    problems,
    secretBox,
    h('section', { class: 'card', 'aria-labelledby': 'keys-list' },
      h('div', { class: 'row spread' }, h('h2', { id: 'keys-list' }, 'Your keys'), field('Show', envSel)),
      h('div', { class: 'scroll' }, h('table', { class: 'keys' },
        h('thead', {}, h('tr', {}, ['Label', 'Key', 'Scopes', 'Budget', 'Spent', 'Status', 'Last used', ''].map((c) => h('th', { scope: 'col' }, c)))),
        tbody))),
    h('form', { class: 'card', onsubmit: create, 'aria-labelledby': 'keys-new' },
      h('h2', { id: 'keys-new' }, 'New key'),
      h('div', { class: 'row' }, field('Label', label), field('Env', env)),
      h('fieldset', { class: 'row checks' }, h('legend', {}, 'Scopes'), scopeBoxes.map((b) => h('label', {}, b, ` ${b.value}`))),
      h('div', { class: 'row' }, field('Budget (units)', budgetUnits), field('Budget (USD)', budgetUSD), field('Budget period', period)),
      h('button', { type: 'submit', class: 'primary', 'data-testid': 'create-key' }, 'Create key')),
    dialog);
  if (carried) {
    showSecret(carried.k, carried.what);
    carried = null;
  }

  envSel.addEventListener('change', load);
  me().then((m) => {
    tz = m?.timezone || 'UTC';
    myKeyID = m?.key.key_id || null;
    if (m?.key.env === 'test') envSel.disabled = true;
  }).catch(() => {}).finally(load);

  async function load() {
    try {
      const res = await api('GET', '/keys', { query: envSel.value === 'test' ? { env: 'test' } : undefined });
      if (closed) return;
      keys = res.keys;
      render();
    } catch (err) {
      showProblem(problems, err);
    }
  }

  function render() {
    replace(tbody, keys.map((k) => {
      const revoked = k.status !== 'active';
      const self = isSelf(k);
      const budget = [k.budget_units != null ? `${fmtInt(k.budget_units)} units` : null, k.budget_usd != null ? fmtUSD(k.budget_usd) : null].filter(Boolean).join(' · ') || 'none';
      return h('tr', { 'data-key-id': k.key_id, 'data-status': k.status, class: revoked ? 'revoked' : '' },
        h('td', { 'data-label': 'Label' }, k.label || h('span', { class: 'muted' }, '(no label)'), self ? h('span', { class: 'badge' }, 'this key') : null),
        h('td', { 'data-label': 'Key' }, h('code', {}, `${k.prefix}…`), h('br'), h('small', { class: 'muted' }, `${k.key_id} · ${k.env}`)),
        h('td', { 'data-label': 'Scopes' }, k.scopes.join(', ')),
        h('td', { 'data-label': 'Budget' }, budget, k.budget_units != null || k.budget_usd != null ? h('small', { class: 'muted' }, ` per ${k.budget_period}`) : null),
        h('td', { 'data-label': 'Spent' }, `${fmtInt(k.spent_units)} units (${fmtUSD(k.spent_usd)})`,
          k.budget_period !== 'total' && k.period_spent_units != null ? h('small', { class: 'muted' }, h('br'), `this ${k.budget_period}: ${fmtInt(k.period_spent_units)}`) : null),
        h('td', { 'data-label': 'Status', 'data-testid': 'key-status' }, revoked ? `revoked ${fmtTime(k.revoked_at, tz)}` : 'active',
          k.rotated_at ? h('small', { class: 'muted' }, h('br'), `rotated ${fmtTime(k.rotated_at, tz)}`) : null),
        h('td', { 'data-label': 'Last used' }, fmtTime(k.last_used_at, tz)),
        h('td', { class: 'actions' }, revoked ? null : [
          h('button', { type: 'button', class: 'small', onclick: () => edit(k), 'aria-label': `Edit ${k.label || k.key_id}` }, 'Edit'),
          h('button', { type: 'button', class: 'small', onclick: () => rotate(k), 'aria-label': `Rotate ${k.label || k.key_id}` }, 'Rotate'),
          h('button', { type: 'button', class: 'small danger', onclick: () => revoke(k), 'aria-label': `Revoke ${k.label || k.key_id}`, 'data-testid': 'revoke' }, 'Revoke')]));
    }));
  }

  function budgetFields(units, usd, p) {
    const out = {};
    if (units !== undefined) out.budget_units = units;
    if (usd !== undefined) out.budget_usd = usd;
    if (p !== undefined) out.budget_period = p;
    return out;
  }

  async function create(e) {
    e.preventDefault();
    clearBox(problems);
    const body = { scopes: scopeBoxes.filter((b) => b.checked).map((b) => b.value) };
    if (label.value.trim()) body.label = label.value.trim();
    if (env.value) body.env = env.value;
    Object.assign(body, budgetFields(
      budgetUnits.value === '' ? undefined : Number(budgetUnits.value),
      budgetUSD.value.trim() === '' ? undefined : budgetUSD.value.trim(),
      period.value));
    try {
      const k = await api('POST', '/keys', { body });
      showSecret(k, 'created');
      label.value = '';
      budgetUnits.value = '';
      budgetUSD.value = '';
      await load();
    } catch (err) {
      showProblem(problems, err);
    }
  }

  // showSecret shows a new secret, once, with a copy button.
  function showSecret(k, what) {
    const secret = h('code', { 'data-testid': 'secret' }, k.api_key);
    const copied = h('span', { 'aria-live': 'polite', class: 'muted' });
    secretBox.hidden = false;
    replace(secretBox,
      h('p', {}, h('strong', {}, `Key ${k.label ? `“${k.label}” ` : ''}${what}.`), ' Its secret is shown this once: copy it now.'),
      h('div', { class: 'row' }, secret,
        h('button', {
          type: 'button', class: 'small', 'data-testid': 'copy-secret',
          onclick: async () => {
            try {
              await navigator.clipboard.writeText(k.api_key);
              copied.textContent = 'Copied.';
            } catch {
              getSelection().selectAllChildren(secret);
              copied.textContent = 'Selected: press Ctrl+C to copy.';
            }
          },
        }, 'Copy'),
        session.key === k.api_key ? null : h('button', { type: 'button', class: 'small', onclick: () => session.set(k.api_key) }, 'Use in this console'),
        h('button', { type: 'button', class: 'small', onclick: () => { secretBox.hidden = true; secretBox.replaceChildren(); } }, 'Done'),
        copied));
    secretBox.querySelector('button').focus();
  }

  // openDialog shows a modal form; submit runs onSubmit, which closes it on success.
  function openDialog(heading, body, submitText, onSubmit, { danger = false } = {}) {
    const err = alertBox();
    const submitBtn = h('button', { type: 'submit', class: danger ? 'danger' : 'primary', 'data-testid': 'dialog-submit' }, submitText);
    replace(dialog, h('form', {
      onsubmit: async (e) => {
        e.preventDefault();
        clearBox(err);
        submitBtn.disabled = true;
        try {
          await onSubmit();
          dialog.close();
        } catch (x) {
          showProblem(err, x);
        } finally {
          submitBtn.disabled = false;
        }
      },
    },
    h('h2', { id: 'dialog-title' }, heading),
    err,
    body,
    h('div', { class: 'row' }, submitBtn, h('button', { type: 'button', onclick: () => dialog.close() }, 'Cancel'))));
    dialog.showModal();
  }

  function edit(k) {
    const l = h('input', { type: 'text', name: 'label', maxlength: 100, value: k.label || '' });
    const boxes = SCOPES.map((s) => h('input', { type: 'checkbox', name: 'scopes', value: s, checked: k.scopes.includes(s) }));
    const units = h('input', { type: 'number', name: 'budget_units', min: 0, step: 1, placeholder: 'none', value: k.budget_units ?? '' });
    const usd = h('input', { type: 'text', name: 'budget_usd', inputmode: 'decimal', placeholder: 'none', value: k.budget_usd ?? '' });
    const p = periodSelect(k.budget_period);
    openDialog(`Edit ${k.label || k.key_id}`,
      [field('Label', l),
        h('fieldset', { class: 'row checks' }, h('legend', {}, 'Scopes'), boxes.map((b) => h('label', {}, b, ` ${b.value}`))),
        h('div', { class: 'row' }, field('Budget (units)', units, 'empty: no budget'), field('Budget (USD)', usd, 'empty: no budget'), field('Period', p))],
      'Save',
      async () => {
        // only what changed: a PATCH that names a field asks to change it
        const body = {};
        if (l.value !== (k.label || '')) body.label = l.value;
        const scopes = boxes.filter((b) => b.checked).map((b) => b.value);
        if (scopes.join() !== SCOPES.filter((s) => k.scopes.includes(s)).join()) body.scopes = scopes;
        const u = units.value === '' ? null : Number(units.value);
        if (u !== (k.budget_units ?? null)) body.budget_units = u;
        const d = usd.value.trim() === '' ? null : usd.value.trim();
        if (d === null ? k.budget_usd != null : Number(d) !== Number(k.budget_usd)) body.budget_usd = d;
        if (p.value !== k.budget_period) body.budget_period = p.value;
        if (!Object.keys(body).length) return;
        await api('PATCH', `/keys/${k.key_id}`, { body });
        showNotice(problems, `Key ${k.label || k.key_id} saved.`);
        await load();
      });
  }

  function rotate(k) {
    const grace = h('input', { type: 'number', name: 'grace_seconds', min: 0, max: 86400, value: 0 });
    openDialog(`Rotate ${k.label || k.key_id}`,
      [h('p', {}, 'A new secret replaces the old one, which stops at once or after the grace period. Spend and budget carry over.'),
        field('Grace (seconds)', grace, '0 to 86400: how long the old secret keeps working')],
      'Rotate',
      async () => {
        const self = isSelf(k);
        const res = await api('POST', `/keys/${k.key_id}/rotate`, { body: { grace_seconds: Number(grace.value) || 0 } });
        if (self) {
          // The console switches to the new secret (the old one stops at once or when
          // its grace ends), which mounts this page afresh; the new page shows it.
          carried = { k: res, what: 'rotated; this console now uses it' };
          session.set(res.api_key);
          return;
        }
        showSecret(res, 'rotated');
        await load();
      });
  }

  function revoke(k) {
    openDialog(`Revoke ${k.label || k.key_id}?`,
      h('p', {}, `Every call made with ${k.prefix}… is refused from now on. This cannot be undone.`),
      'Revoke key',
      async () => {
        const self = isSelf(k);
        await api('DELETE', `/keys/${k.key_id}`);
        if (self) {
          session.clear();
          return;
        }
        showNotice(problems, `Key ${k.label || k.key_id} revoked: its calls are refused from now on.`);
        await load();
      }, { danger: true });
  }

  return () => {
    closed = true;
    if (dialog.open) dialog.close();
  };
}

function periodSelect(value) {
  const s = h('select', { name: 'budget_period' }, ['total', 'month', 'day'].map((p) => h('option', { value: p }, p)));
  s.value = value || 'total';
  return s;
}
