// Account: the page POST /billing/portal points to, and the one the verification and
// recovery messages point to. Without a key: sign up (the new key goes straight into
// this tab's session), verify an address with the message's token, or get a new key by
// mail (key recovery: the key goes into the session as signup's). With one: the account
// (GET /me), its address's verification (the token, or a new message), its time zone
// and budget (PATCH /me), the plan.

import { api, session, me } from './api.js';
import { h, replace, field, alertBox, showProblem, showNotice, clearBox, fmtTime, fmtUSD, fmtInt } from './ui.js';

export const title = 'Account';

export function mount(root) {
  const problems = alertBox();
  if (!session.key) {
    const email = h('input', { type: 'email', name: 'email', required: true, autocomplete: 'email', 'data-testid': 'signup-email' });
    const name = h('input', { type: 'text', name: 'name', autocomplete: 'name', maxlength: 200 });
    replace(root,
      h('h1', {}, 'Account'),
      problems,
      h('p', {}, 'Enter an API key above, or create an account: its first key is shown once and kept in this tab only.'),
      h('form', {
        class: 'card',
        onsubmit: async (e) => {
          e.preventDefault();
          clearBox(problems);
          try {
            const res = await api('POST', '/signup', { body: { email: email.value.trim(), name: name.value.trim() || undefined, source: 'console' } });
            sessionStorage.setItem('chessd.signup', res.api_key); // shown once on the next render
            session.set(res.api_key);
          } catch (err) {
            showProblem(problems, err);
          }
        },
      }, h('h2', {}, 'Sign up'), field('E-mail', email), field('Name (optional)', name), h('button', { type: 'submit', class: 'primary' }, 'Create account')),
      verifyForm(problems),
      recoverForm(problems));
    return null;
  }

  const fresh = sessionStorage.getItem('chessd.signup');
  const recovered = sessionStorage.getItem('chessd.recovered') === '1';
  sessionStorage.removeItem('chessd.signup');
  sessionStorage.removeItem('chessd.recovered');
  const info = h('dl', { class: 'facts', 'data-testid': 'account' });
  const tzSel = h('select', { name: 'timezone' }, Intl.supportedValuesOf('timeZone').concat('UTC').sort().map((z) => h('option', { value: z }, z)));
  const units = h('input', { type: 'number', name: 'budget_units', min: 0, step: 1, placeholder: 'none' });
  const usd = h('input', { type: 'text', name: 'budget_usd', inputmode: 'decimal', placeholder: 'none' });
  const period = h('select', { name: 'budget_period' }, ['total', 'month', 'day'].map((p) => h('option', { value: p }, p)));
  const budgetNow = h('p', { class: 'muted' });
  const verifyCard = verifyForm(problems, async (res) => {
    const m = await me({ fresh: true });
    // the answer to the token is the word on this account's address, should GET /me lag
    show(res.account_id === m.account_id && res.email === m.email && res.email_verified ? { ...m, email_verified: true } : m);
  }, h('button', { type: 'button', onclick: resend }, 'Resend verification e-mail'));
  verifyCard.hidden = true;
  let current = null;
  replace(root,
    h('h1', {}, 'Account'),
    problems,
    fresh ? h('div', { class: 'secret' }, h('p', {}, recovered
      ? [h('strong', {}, 'A new key for your account.'), ' It is shown once and in use in this tab; the account’s other keys keep working (revoke those you do not know on the Keys page):']
      : [h('strong', {}, 'Your account is ready.'), ' This is its first key, shown once; it is in use in this tab:']),
    h('code', { 'data-testid': 'signup-secret' }, fresh)) : null,
    h('section', { class: 'card' }, h('h2', {}, 'Account'), info),
    verifyCard,
    h('form', { class: 'card', onsubmit: saveTz }, h('h2', {}, 'Time zone'),
      h('p', { class: 'muted' }, 'Usage days, statement times and budgets by day or month follow it.'),
      h('div', { class: 'row' }, field('Time zone', tzSel), h('button', { type: 'submit' }, 'Save time zone'))),
    h('form', { class: 'card', onsubmit: saveBudget }, h('h2', {}, 'Account budget'),
      h('p', { class: 'muted' }, 'What all keys of this env may spend together, on top of each key’s own budget. Empty: none.'),
      budgetNow,
      h('div', { class: 'row' }, field('Units', units), field('USD', usd), field('Period', period), h('button', { type: 'submit' }, 'Save budget'))),
    h('section', { class: 'card' }, h('h2', {}, 'Plan'),
      h('p', { class: 'muted' }, 'Paid plans are bought through checkout, once the address is verified; the service says when that is not open yet.'),
      h('div', { class: 'row' },
        h('button', { type: 'button', onclick: () => checkout('hobby') }, 'Upgrade to hobby'),
        h('button', { type: 'button', onclick: () => checkout('pro') }, 'Upgrade to pro'))));
  load();

  async function load() {
    try {
      show(await me({ fresh: true }));
    } catch (err) {
      showProblem(problems, err);
    }
  }

  function show(m) {
    current = m;
    verifyCard.hidden = !!m.email_verified;
    const c = m.caps || {};
    replace(info,
      h('dt', {}, 'Account'), h('dd', {}, h('code', {}, m.account_id)),
      h('dt', {}, 'E-mail'), h('dd', {}, m.email, m.email_verified ? ' (verified)' : ' (not verified)'),
      m.name ? [h('dt', {}, 'Name'), h('dd', {}, m.name)] : null,
      h('dt', {}, 'Plan'), h('dd', { 'data-testid': 'plan' }, m.plan, c.units_per_day ? ` — ${fmtInt(c.units_per_day)} units a day, depth ≤ ${c.max_depth}, MultiPV ≤ ${c.max_multipv}` : ''),
      h('dt', {}, 'Created'), h('dd', {}, fmtTime(m.created_at, m.timezone)),
      h('dt', {}, 'Keys'), h('dd', {}, `${m.keys.active} active of ${m.keys.total} (${m.key.env})`),
      h('dt', {}, 'This key'), h('dd', {}, h('code', {}, m.key.key_id), ` ${m.key.env}: ${m.key.scopes.join(', ')}`),
      m.today ? [h('dt', {}, 'Today'), h('dd', {}, `${fmtInt(m.today.units)} of ${fmtInt(m.today.allowance_units)} units`)] : null);
    tzSel.value = m.timezone || 'UTC';
    const b = m.budget || {};
    units.value = b.budget_units ?? '';
    usd.value = b.budget_usd ?? '';
    period.value = b.budget_period || 'month';
    budgetNow.textContent = b.budget_units != null || b.budget_usd != null
      ? `Now: ${b.budget_units != null ? `${fmtInt(b.budget_units)} units` : ''} ${b.budget_usd != null ? fmtUSD(b.budget_usd) : ''} per ${b.budget_period}; spent ${fmtInt(b.period_spent_units)} units, left ${fmtInt(b.remaining_units)}.`
      : 'Now: none.';
  }

  async function patch(body, what) {
    clearBox(problems);
    try {
      show(await api('PATCH', '/me', { body }));
      await me({ fresh: true });
      showNotice(problems, `${what} saved.`);
    } catch (err) {
      showProblem(problems, err);
    }
  }

  function saveTz(e) {
    e.preventDefault();
    patch({ timezone: tzSel.value }, 'Time zone');
  }

  function saveBudget(e) {
    e.preventDefault();
    const b = current?.budget || {};
    const body = { budget_period: period.value };
    const u = units.value === '' ? null : Number(units.value);
    if (u !== (b.budget_units ?? null)) body.budget_units = u;
    const d = usd.value.trim() === '' ? null : usd.value.trim();
    if (d === null ? b.budget_usd != null : Number(d) !== Number(b.budget_usd)) body.budget_usd = d;
    patch(body, 'Budget');
  }

  async function checkout(plan) {
    clearBox(problems);
    try {
      const res = await api('POST', '/billing/checkout', { body: { plan } });
      showNotice(problems, 'Continue to payment: ', h('a', { href: res.checkout_url, rel: 'noopener' }, res.checkout_url));
    } catch (err) {
      showProblem(problems, err);
    }
  }

  async function resend() {
    clearBox(problems);
    try {
      const res = await api('POST', '/me/verify-email');
      showNotice(problems, `A verification message is on its way to ${res.email}.`);
    } catch (err) {
      showProblem(problems, err);
    }
  }

  return null;
}

// verifyForm takes the token of the verification message and sends it
// (POST /verify-email: no key needed, the token is the proof), saying in box what
// became of it; onVerified(answer) runs first when it verified an address. extra goes
// beside the submit button.
function verifyForm(box, onVerified, ...extra) {
  const token = h('input', {
    type: 'text', name: 'token', required: true, autocomplete: 'off', spellcheck: 'false', maxlength: 100, placeholder: 'ev_…', 'data-testid': 'verify-token',
  });
  return h('form', {
    class: 'card',
    onsubmit: async (e) => {
      e.preventDefault();
      clearBox(box);
      try {
        const res = await api('POST', '/verify-email', { body: { token: token.value.trim() } });
        token.value = '';
        await onVerified?.(res);
        showNotice(box, `The address ${res.email} is verified.`);
      } catch (err) {
        showProblem(box, err);
      }
    },
  },
  h('h2', {}, 'Verify your e-mail address'),
  h('p', { class: 'muted' }, 'Paste the token (ev_…) of the verification message; it works once, for 24 hours, and needs no key.'),
  h('div', { class: 'row' }, field('Token', token), h('button', { type: 'submit', 'data-testid': 'verify-submit' }, 'Verify address'), extra));
}

// recoverForm gets a new key by mail, for an account whose keys are all lost: the
// address (POST /recover: a message with a token goes to it if an account holds it),
// then the message's token (POST /recover/confirm: the new key, shown once, goes into
// this tab's session as signup's does).
function recoverForm(box) {
  const email = h('input', { type: 'email', name: 'email', required: true, autocomplete: 'email', 'data-testid': 'recover-email' });
  const token = h('input', {
    type: 'text', name: 'token', required: true, autocomplete: 'off', spellcheck: 'false', maxlength: 100, placeholder: 'rk_…', 'data-testid': 'recover-token',
  });
  const revoke = h('input', { type: 'checkbox', name: 'revoke_other_keys', 'data-testid': 'recover-revoke' });
  async function ask(e) {
    e.preventDefault();
    clearBox(box);
    try {
      const res = await api('POST', '/recover', { body: { email: email.value.trim() } });
      showNotice(box, `If an account holds ${res.email}, a message with a recovery token is on its way there; paste the token below.`);
    } catch (err) {
      showProblem(box, err);
    }
  }
  async function confirm(e) {
    e.preventDefault();
    clearBox(box);
    try {
      const res = await api('POST', '/recover/confirm', { body: { token: token.value.trim(), revoke_other_keys: revoke.checked } });
      sessionStorage.setItem('chessd.signup', res.api_key); // shown once on the next render
      sessionStorage.setItem('chessd.recovered', '1');
      session.set(res.api_key);
    } catch (err) {
      showProblem(box, err);
    }
  }
  return h('section', { class: 'card' },
    h('h2', {}, 'Lost your key?'),
    h('p', { class: 'muted' }, 'A new key for your account, by mail: the token (rk_…) works once, for an hour, and also verifies the address.'),
    h('form', { class: 'row', onsubmit: ask }, field('E-mail', email), h('button', { type: 'submit', 'data-testid': 'recover-submit' }, 'Send a recovery token')),
    h('form', { class: 'row', onsubmit: confirm }, field('Token', token),
      h('label', {}, revoke, ' Revoke every other key of the account and delete its webhook endpoints (someone else may hold a key)'),
      h('button', { type: 'submit', 'data-testid': 'recover-confirm' }, 'Get a new key')));
}
