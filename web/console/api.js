// The console's only way to the service: fetch() under /v1, the key from session
// storage in the Authorization header (never in a URL), problem+json turned into
// Problem errors, and Server-Sent Events read from a fetch() body, since EventSource can
// neither POST nor send a header.

const KEY = 'chessd.key';

// session holds the API key for this tab only: sessionStorage, gone when the tab closes.
export const session = {
  get key() {
    return sessionStorage.getItem(KEY) || '';
  },
  set(key) {
    sessionStorage.setItem(KEY, key.trim());
    window.dispatchEvent(new Event('chessd:key'));
  },
  clear() {
    sessionStorage.removeItem(KEY);
    window.dispatchEvent(new Event('chessd:key'));
  },
};

// Problem is an answer of the service that was not a success: its problem+json document.
// retryAfter is the answer's Retry-After in seconds, or null without one.
export class Problem extends Error {
  constructor(doc, status, retryAfter = null) {
    super(doc.detail || doc.title || `HTTP ${status}`);
    this.status = status;
    this.doc = doc;
    this.retryAfter = retryAfter;
  }
}

async function problemOf(res) {
  let doc;
  try {
    doc = await res.json();
  } catch {
    doc = { title: res.statusText || 'Request failed', status: res.status };
  }
  const after = res.headers.get('Retry-After');
  return new Problem(doc, res.status, after && /^\d+$/.test(after) ? +after : null);
}

function request(method, path, { body, query, accept, signal, headers = {} } = {}) {
  const h = { ...headers };
  if (session.key) h.Authorization = `Bearer ${session.key}`;
  if (body !== undefined) h['Content-Type'] = 'application/json';
  if (accept) h.Accept = accept;
  const qs = query ? new URLSearchParams(Object.entries(query).filter(([, v]) => v !== undefined && v !== '' && v !== null)) : null;
  const url = `/v1${path}${qs && qs.toString() ? `?${qs}` : ''}`;
  return fetch(url, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), signal, cache: 'no-store' });
}

// api answers the decoded JSON body (null for 204), or throws a Problem.
export async function api(method, path, opts = {}) {
  const res = await request(method, path, opts);
  if (!res.ok) throw await problemOf(res);
  if (res.status === 204) return null;
  return res.json();
}

// download fetches a CSV answer and hands it to the browser as a file: all of it, page
// after page, following each page's `Link: <…>; rel="next"` (the header row kept from
// the first page only), so a statement of more than a page downloads whole.
export async function download(path, query, filename) {
  const parts = [];
  let cursor = null;
  for (;;) {
    const res = await request('GET', path, { query: cursor ? { ...query, cursor } : query, accept: 'text/csv' });
    if (!res.ok) throw await problemOf(res);
    let text = await res.text();
    if (parts.length) text = text.includes('\n') ? text.slice(text.indexOf('\n') + 1) : ''; // the header row, once
    if (text && !text.endsWith('\n')) text += '\n';
    parts.push(text);
    const next = nextCursor(res.headers.get('Link'));
    if (!next || next === cursor) break;
    cursor = next;
  }
  const url = URL.createObjectURL(new Blob(parts, { type: 'text/csv' }));
  const a = document.createElement('a');
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// nextCursor is the cursor of a Link header's rel="next" URL, or null. The next page is
// asked for under this console's own /v1 with the same query and that cursor, not at
// the URL itself: it is on the server's configured base address, which may be another
// origin than the console's (behind a proxy, say), where the key must not go.
function nextCursor(link) {
  for (const part of (link || '').split(',')) {
    const m = /^\s*<([^>]*)>(.*)$/.exec(part);
    if (m && /;\s*rel="?next"?(\s|;|$)/.test(m[2])) return new URL(m[1], location.href).searchParams.get('cursor');
  }
  return null;
}

// stream reads a text/event-stream answer, calling onEvent(name, data, id) per event
// with its JSON data, and onRetry(ms) for the server's reconnection delay (`retry:`).
// It resolves when the stream ends (false when the server answered 204: nothing left to
// send) and throws a Problem when the answer is not a stream.
export async function stream(method, path, { body, signal, onEvent, onRetry, lastEventId }) {
  const headers = lastEventId ? { 'Last-Event-ID': lastEventId } : {};
  const res = await request(method, path, { body, signal, accept: 'text/event-stream', headers });
  if (!res.ok) throw await problemOf(res);
  if (res.status === 204) return false;
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return true;
    buf += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let name = 'message';
      let id = null;
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue; // a comment: keep-alive
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const val = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') name = val;
        else if (field === 'data') data.push(val);
        else if (field === 'id') id = val;
        else if (field === 'retry' && /^\d+$/.test(val)) onRetry?.(+val);
      }
      if (data.length) onEvent(name, JSON.parse(data.join('\n')), id);
    }
  }
}

// engines is GET /engines, asked once per page load.
let enginesPromise;
export function engines() {
  enginesPromise ??= api('GET', '/engines').catch((err) => {
    enginesPromise = undefined;
    throw err;
  });
  return enginesPromise;
}

// me is GET /me for the current key (null without one), cached until the key changes.
let mePromise;
let meKey;
export function me({ fresh = false } = {}) {
  if (!session.key) return Promise.resolve(null);
  if (fresh || meKey !== session.key) {
    meKey = session.key;
    mePromise = api('GET', '/me').catch((err) => {
      meKey = undefined;
      throw err;
    });
  }
  return mePromise;
}

// scopes answers the current key's scopes, by GET /me when the key may read it.
export async function hasScope(scope) {
  const m = await me();
  return !!m && m.key.scopes.includes(scope);
}
