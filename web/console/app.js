// The console's shell: the key bar, and a router over the pages (history API; every
// page path is served index.html by the server).

import 'chessground/assets/chessground.base.css';
import 'chessground/assets/chessground.brown.css';
import 'chessground/assets/chessground.cburnett.css';
import './style.css';

import { session, me } from './api.js';
import { h, replace } from './ui.js';
import * as play from './play.js';
import * as jobs from './jobs.js';
import * as usage from './usage.js';
import * as keys from './keys.js';
import * as account from './account.js';

const pages = {
  '/': play, '/play': play, '/jobs': jobs, '/usage': usage, '/keys': keys, '/account': account,
};

const main = document.getElementById('main');
let unmount = null;

function navigate(path, push) {
  const page = pages[path] || null;
  if (push) history.pushState(null, '', path);
  if (unmount) unmount();
  unmount = null;
  main.replaceChildren();
  for (const a of document.querySelectorAll('nav a[data-nav]')) {
    if (a.pathname === path || (path === '/' && a.pathname === '/play')) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!page) {
    main.append(h('h1', {}, 'No such page'), h('p', {}, h('a', { href: '/', 'data-nav': '' }, 'Go to the playground')));
    return;
  }
  document.title = `${page.title} · chessd console`;
  unmount = page.mount(main) || null;
}

// Links marked data-nav move between pages without a reload; focus goes to the page.
document.addEventListener('click', (e) => {
  const a = e.target.closest('a[data-nav]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  e.preventDefault();
  navigate(a.pathname, a.pathname !== location.pathname);
  main.focus();
});
window.addEventListener('popstate', () => navigate(location.pathname, false));

// The key bar: enter a key once (kept in this tab's sessionStorage), or forget it.
const keybar = document.getElementById('keybar');
function renderKeybar() {
  const key = session.key;
  if (key) {
    replace(keybar,
      h('span', { class: 'key-id', title: 'The key is kept in this tab only (session storage)' }, 'Key ', h('code', {}, `${key.slice(0, 12)}…`)),
      h('button', { type: 'button', class: 'small', onclick: () => session.clear() }, 'Forget key'));
    me().then((m) => {
      if (m && session.key === key) keybar.querySelector('.key-id').title = `${m.email} · ${m.plan} plan · ${m.key.env} key ${m.key.key_id}`;
    }).catch(() => {});
    return;
  }
  const input = h('input', { type: 'password', name: 'key', id: 'key-input', autocomplete: 'off', placeholder: 'ce_live_…', required: true, spellcheck: 'false' });
  replace(keybar, h('form', {
    class: 'keyform',
    onsubmit: (e) => {
      e.preventDefault();
      if (input.value.trim()) session.set(input.value);
    },
  }, h('label', { for: 'key-input' }, 'API key'), input, h('button', { type: 'submit', class: 'small' }, 'Use key')));
}
window.addEventListener('chessd:key', () => {
  renderKeybar();
  navigate(location.pathname, false); // pages read the key when they mount
});

renderKeybar();
navigate(location.pathname, false);
