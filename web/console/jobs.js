// Jobs: submit a PGN (POST /analyze) or a list of FENs (POST /batch), watch it over
// GET /jobs/{id}/events (read with fetch(): EventSource cannot send the key), cancel it,
// then step through the positions with an evaluation graph; the account's jobs
// (GET /jobs) are listed to open again.

import { api, engines, session, stream } from './api.js';
import { makeBoard, Chess, arrow } from './board.js';
import { chart } from './charts.js';
import { h, replace, field, alertBox, showProblem, clearBox, needKey, fmtEval, pawns, fmtUSD, dataTable, cssVar } from './ui.js';

export const title = 'Jobs';

// jobProblemText says why a job failed, from its error (a problem, as the API's
// answers have them): "Invalid API key: the job's key was revoked: … Next: fix request."
function jobProblemText(p) {
  const next = p.next_action ? ` Next: ${p.next_action.replace(/_/g, ' ')}.` : '';
  return `${p.title}: ${p.detail}${next}`;
}

const SAMPLE = `[Event "Opera game"]
[White "Paul Morphy"]
[Black "Duke Karl / Count Isouard"]

1. e4 e5 2. Nf3 d6 3. d4 Bg4 4. dxe5 Bxf3 5. Qxf3 dxe5 6. Bc4 Nf6 7. Qb3 Qe7
8. Nc3 c6 9. Bg5 b5 10. Nxb5 cxb5 11. Bxb5+ Nbd7 12. O-O-O Rd8
13. Rxd7 Rxd7 14. Rd1 Qe6 15. Bxd7+ Nxd7 16. Qb8+ Nxb8 17. Rd8# 1-0`;

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);

// The job of this tab, kept across visits of the page while the key stays the same:
// another key may be another account, which cannot see this one's job or input.
const state = { key: '', input: '', kind: 'pgn', depth: 10, multipv: 1, engine: '', jobId: null };

export function mount(root) {
  if (!session.key) {
    replace(root, h('h1', {}, 'Jobs'), needKey('Submitting a job'));
    return null;
  }
  const key = session.key;
  if (state.key !== key) Object.assign(state, { key, input: '', kind: 'pgn', jobId: null });
  const problems = alertBox();
  const kindPgn = h('input', { type: 'radio', name: 'kind', value: 'pgn', checked: state.kind === 'pgn' });
  const kindFens = h('input', { type: 'radio', name: 'kind', value: 'fens', checked: state.kind === 'fens' });
  const input = h('textarea', { name: 'input', rows: 8, spellcheck: 'false', 'data-testid': 'job-input', placeholder: 'A PGN game, or FENs one per line' });
  input.value = state.input;
  const depthIn = h('input', { type: 'number', name: 'depth', min: 1, max: 14, value: state.depth });
  const multipvIn = h('input', { type: 'number', name: 'multipv', min: 1, max: 3, value: state.multipv });
  const engineSel = h('select', { name: 'engine' }, h('option', { value: '' }, 'latest (native)'));
  const priceEl = h('p', { class: 'price', 'aria-live': 'polite', 'data-testid': 'job-price' });
  const submitBtn = h('button', { type: 'submit', class: 'primary', 'data-testid': 'job-submit' }, 'Run job');

  const jobEl = h('section', { class: 'job', 'aria-label': 'Job', hidden: true });
  const jobHead = h('p', { 'data-testid': 'job-state' });
  const progress = h('progress', { max: 1, value: 0, 'data-testid': 'job-progress', 'aria-label': 'Job progress' });
  const progressText = h('span', { 'data-testid': 'job-progress-text' }, '0%');
  const cancelBtn = h('button', { type: 'button', onclick: cancel, 'data-testid': 'job-cancel' }, 'Cancel job');
  const rows = h('tbody', { 'data-testid': 'job-positions' });
  const review = h('div', { class: 'review', hidden: true, 'data-testid': 'job-review' });
  const listBody = h('tbody', { 'data-testid': 'jobs-list' });
  const olderBtn = h('button', { type: 'button', hidden: true, onclick: () => loadJobs(true), 'data-testid': 'jobs-older' }, 'Older jobs');
  const listEl = h('section', { class: 'card', 'aria-label': 'Your jobs' },
    h('h2', {}, 'Your jobs'),
    h('div', { class: 'scroll' }, h('table', {},
      h('thead', {}, h('tr', {}, ['Submitted', 'Kind', 'State', 'Positions', 'Units', ''].map((c) => h('th', { scope: 'col' }, c)))),
      listBody)),
    olderBtn);

  replace(root,
    h('h1', {}, 'Jobs'),
    problems,
    h('form', { class: 'card', onsubmit: submit },
      h('fieldset', { class: 'row checks' }, h('legend', {}, 'Input'),
        h('label', {}, kindPgn, ' PGN game (POST /analyze)'), h('label', {}, kindFens, ' FEN list (POST /batch)')),
      field('Game or positions', input, 'Up to 50 positions: the first 50 plies of a game, or 50 FENs'),
      h('div', { class: 'row' },
        field('Depth', depthIn), field('MultiPV', multipvIn), field('Engine', engineSel),
        h('button', { type: 'button', onclick: () => { input.value = SAMPLE; kindPgn.checked = true; changed(); } }, 'Sample game')),
      priceEl,
      submitBtn),
    jobEl,
    listEl);
  replace(jobEl,
    h('h2', {}, 'Progress'),
    jobHead,
    h('div', { class: 'row progress-row' }, progress, progressText, cancelBtn),
    review,
    h('details', { open: true }, h('summary', {}, 'Positions as they finish'),
      h('div', { class: 'scroll' }, h('table', {},
        h('thead', {}, h('tr', {}, ['#', 'Move', 'Eval', 'Best', 'Depth', 'Units'].map((c) => h('th', { scope: 'col' }, c)))),
        rows))));

  for (const el of [kindPgn, kindFens, input, depthIn, multipvIn, engineSel]) el.addEventListener('change', changed);
  input.addEventListener('input', changed);
  engines().then((e) => {
    for (const v of e.versions) for (const p of v.paths) engineSel.append(h('option', { value: `${v.id}|${p.path}` }, `${p.name} (${v.id}, ${p.path})`));
    engineSel.value = state.engine;
  }).catch((err) => showProblem(problems, err));

  let ctl = null; // the open event stream
  let job = null;
  let positions = [];
  let graph = null;
  let viewer = null;
  let quoteSeq = 0; // the latest price asked: older answers are dropped
  let listCursor = null;
  changed();
  loadJobs(false);
  if (state.jobId) follow(state.jobId);

  // loadJobs shows the newest jobs, or adds the next older page.
  async function loadJobs(older) {
    const query = { limit: 10 };
    if (older && listCursor) query.cursor = listCursor;
    try {
      const page = await api('GET', '/jobs', { query });
      if (!older) listBody.replaceChildren();
      for (const j of page.jobs) {
        listBody.append(h('tr', { 'data-job': j.job_id },
          h('td', {}, new Date(j.created_at).toLocaleString()),
          h('td', {}, j.kind),
          h('td', { 'data-testid': 'listed-state', title: j.error ? jobProblemText(j.error) : '' },
            j.error ? `${j.state}: ${j.error.title}` : j.state),
          h('td', {}, `${j.positions_done}/${j.positions_total}`),
          h('td', {}, j.cost_units),
          h('td', {}, h('button', { type: 'button', 'aria-label': `Open job ${j.job_id}`, onclick: () => { state.jobId = j.job_id; follow(j.job_id); } }, 'Open'))));
      }
      if (!older && !page.jobs.length) listBody.append(h('tr', {}, h('td', { colspan: 6 }, 'No jobs yet.')));
      listCursor = page.next_cursor;
      olderBtn.hidden = !listCursor;
    } catch (err) {
      showProblem(problems, err);
    }
  }

  // positionsOf counts what the input would submit (chess.js reads the PGN).
  function positionsOf() {
    const text = input.value.trim();
    if (!text) return 0;
    if (kindFens.checked) return text.split('\n').filter((l) => l.trim()).length;
    try {
      const c = new Chess();
      c.loadPgn(text);
      return Math.min(50, c.history().length);
    } catch {
      return 0;
    }
  }

  function changed() {
    Object.assign(state, { input: input.value, kind: kindFens.checked ? 'fens' : 'pgn', depth: +depthIn.value || 10, multipv: +multipvIn.value || 1, engine: engineSel.value });
    const n = positionsOf();
    const seq = ++quoteSeq;
    if (!n) {
      replace(priceEl, 'Price: enter a game or positions.');
      return;
    }
    const endpoint = state.kind === 'fens' ? 'batch' : 'analyze';
    api('GET', '/price', { query: { endpoint, depth: state.depth, multipv: state.multipv, [endpoint === 'batch' ? 'items' : 'plies']: Math.min(n, 50) } })
      .then((p) => {
        if (seq === quoteSeq) replace(priceEl, `Price for ${n} position${n === 1 ? '' : 's'}: `, h('strong', {}, `${p.units} units`), ` (${fmtUSD(p.usd)}), held when submitted; positions served from the cache cost less.`);
      })
      .catch((err) => { if (seq === quoteSeq) replace(priceEl, `No price: ${err.message}`); });
  }

  async function submit(e) {
    e.preventDefault();
    clearBox(problems);
    changed();
    const [engine, path] = state.engine ? state.engine.split('|') : [];
    const body = { depth: state.depth, multipv: state.multipv };
    if (engine) Object.assign(body, { engine, path });
    let endpoint = '/analyze';
    if (state.kind === 'fens') {
      endpoint = '/batch';
      body.fens = input.value.split('\n').map((l) => l.trim()).filter(Boolean);
    } else {
      body.pgn = input.value;
    }
    submitBtn.disabled = true;
    try {
      const j = await api('POST', endpoint, { body });
      if (session.key !== key) return; // the key changed meanwhile: the page is gone
      state.jobId = j.job_id;
      loadJobs(false);
      follow(j.job_id);
    } catch (err) {
      showProblem(problems, err);
    } finally {
      submitBtn.disabled = false;
    }
  }

  // follow reads the job's event stream to its end, reconnecting with Last-Event-ID.
  async function follow(id) {
    ctl?.abort();
    const mine = new AbortController();
    ctl = mine;
    job = null;
    positions = [];
    replace(jobHead);
    rows.replaceChildren();
    // The last job's review goes with it: its board, kept while hidden, would redraw
    // its arrow at size 0 (NaN coordinates: console errors).
    viewer?.destroy();
    graph?.destroy();
    viewer = graph = null;
    replace(review);
    review.hidden = true;
    jobEl.hidden = false;
    setProgress(0, 1);
    let last = null;
    let ended = false;
    let retry = 0; // the server's retry: hint, the least wait before reconnecting
    let drops = 0; // connections in a row that ended without an event
    let after = 0; // a refusal's Retry-After, in ms, for the next wait only
    for (;;) {
      try {
        const more = await stream('GET', `/jobs/${id}/events`, {
          signal: mine.signal,
          lastEventId: last,
          onRetry: (ms) => { retry = ms; },
          onEvent: (name, data, eid) => {
            if (eid) last = eid;
            drops = 0; // the connection worked: a later drop starts the backoff afresh
            onJobEvent(name, data);
            if (name === 'end') ended = true;
          },
        });
        if (!more) ended = true;
      } catch (err) {
        if (mine.signal.aborted) return;
        // Too many streams open (429) or a server stopping (503): for a while only,
        // so follow again once Retry-After has passed.
        if ((err.status === 429 || err.status === 503) && err.retryAfter !== null) {
          after = err.retryAfter * 1000;
        } else if (err.status) { // the service refused: not a dropped connection
          showProblem(problems, err);
          return;
        }
      }
      if (ended || mine.signal.aborted) break;
      // A dropped connection, or one ended cleanly without `end` (a proxy's cut, a
      // restart): wait before reconnecting, or a stream cut at once loops without pause.
      await new Promise((r) => setTimeout(r, Math.max(after, retry, Math.min(5000, 500 * 2 ** drops++))));
      after = 0;
    }
    if (!mine.signal.aborted) {
      loadJobs(false); // the list shows the job's final state
      await showReview(id);
    }
  }

  function onJobEvent(name, data) {
    if (name === 'state' || name === 'end') {
      job = data;
      replace(jobHead, 'Job ', h('code', {}, data.job_id), ` (${data.kind}): `, h('strong', { 'data-testid': 'job-state-name' }, data.state),
        `, charged ${data.cost_units} units (${fmtUSD(data.cost_usd)})`,
        data.error ? h('span', { 'data-testid': 'job-error' }, `: ${jobProblemText(data.error)}`) : '');
      setProgress(data.positions_done, data.positions_total);
      cancelBtn.disabled = TERMINAL.has(data.state);
    } else if (name === 'progress') {
      setProgress(data.done, data.total);
    } else if (name === 'position') {
      positions[data.index] = data;
      rows.append(h('tr', {},
        h('td', {}, data.index + 1),
        h('td', {}, data.move_san ? plyLabel(data.ply, data.move_san) : data.fen.split(' ').slice(0, 2).join(' ')),
        h('td', {}, fmtEval(data.eval)),
        h('td', {}, data.bestmove_san || '–'),
        h('td', {}, data.depth ?? '–'),
        h('td', {}, data.cost_units ?? '–')));
    }
  }

  function setProgress(done, total) {
    progress.max = total || 1;
    progress.value = done;
    const pct = total ? Math.round((done / total) * 100) : 0;
    progressText.textContent = `${done}/${total} (${pct}%)`;
    progress.setAttribute('aria-valuetext', `${pct}%`);
  }

  async function cancel() {
    if (!job) return;
    clearBox(problems);
    try {
      onJobEvent('state', await api('DELETE', `/jobs/${job.job_id}`));
    } catch (err) {
      showProblem(problems, err);
    }
  }

  // showReview draws the evaluation graph and a board to step through the positions.
  async function showReview(id) {
    let res;
    try {
      res = await api('GET', `/jobs/${id}/result`);
    } catch (err) {
      showProblem(problems, err);
      return;
    }
    const ps = res.positions;
    const done = ps.filter((p) => p.status === 'done');
    if (!done.length) return;
    review.hidden = false;
    const canvas = h('canvas', { role: 'img', 'aria-label': 'Evaluation over the positions, in pawns from White’s view', 'data-testid': 'eval-graph' });
    const boardEl = h('div', { class: 'board small' });
    const caption = h('p', { 'aria-live': 'polite', 'data-testid': 'review-caption' });
    let at = 0;
    const label = (p, i) => {
      if (res.kind === 'analyze') return i === 0 ? 'start' : plyLabel(ps[i - 1].ply, ps[i - 1].move_san);
      return `#${i + 1}`;
    };
    const step = (i) => {
      at = Math.max(0, Math.min(ps.length - 1, i));
      const p = ps[at];
      const c = new Chess(p.fen);
      const prev = res.kind === 'analyze' && at > 0 ? ps[at - 1].move : null;
      viewer.show(c, prev ? [prev.slice(0, 2), prev.slice(2, 4)] : undefined, [arrow(p.bestmove, 'green')].filter(Boolean));
      replace(caption, `Position ${at + 1} of ${ps.length} (${label(p, at)}): `, h('strong', {}, fmtEval(p.eval)),
        p.bestmove_san ? `, best ${p.bestmove_san}` : '', p.move_san ? `; played ${p.move_san}` : '');
      if (graph) {
        graph.setActiveElements([{ datasetIndex: 0, index: at }]);
        graph.update();
      }
    };
    const keys = (e) => {
      const to = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: ps.length - 1 }[e.key];
      if (to !== undefined) {
        e.preventDefault();
        step(to);
      }
    };
    replace(review,
      h('h2', {}, 'Review'),
      h('div', { class: 'chart tall' }, canvas),
      dataTable('Evaluation by position', ['#', 'After', 'Eval', 'Best'], ps.map((p, i) => [i + 1, label(p, i), fmtEval(p.eval), p.bestmove_san || '–'])),
      h('div', { class: 'review-board', onkeydown: keys },
        boardEl,
        h('div', {},
          caption,
          h('div', { class: 'row', role: 'group', 'aria-label': 'Step through the positions (arrow keys work too)' },
            h('button', { type: 'button', onclick: () => step(0), 'aria-label': 'First position' }, '«'),
            h('button', { type: 'button', onclick: () => step(at - 1), 'aria-label': 'Previous position', 'data-testid': 'step-prev' }, '◀'),
            h('button', { type: 'button', onclick: () => step(at + 1), 'aria-label': 'Next position', 'data-testid': 'step-next' }, '▶'),
            h('button', { type: 'button', onclick: () => step(ps.length - 1), 'aria-label': 'Last position' }, '»')))));
    viewer?.destroy();
    viewer = makeBoard(boardEl);
    graph?.destroy();
    graph = chart(canvas, {
      type: 'line',
      data: {
        labels: ps.map(label),
        datasets: [{
          label: 'Evaluation (pawns, White)', data: ps.map((p) => pawns(p.eval)), borderColor: cssVar('--accent'),
          backgroundColor: cssVar('--accent-soft'), fill: 'origin', pointRadius: 3, tension: 0.2,
        }],
      },
      options: {
        scales: { y: { min: -10, max: 10, title: { display: true, text: 'pawns (White)' } } },
        plugins: { legend: { display: false } },
        onClick: (_e, els) => { if (els.length) step(els[0].index); },
      },
    });
    canvas.dataset.points = String(ps.length);
    step(0);
  }

  return () => {
    ctl?.abort();
    graph?.destroy();
    viewer?.destroy();
  };
}

// plyLabel names a move by its ply: 3 → "2. Nf3", 4 → "2… Nc6".
function plyLabel(ply, san) {
  return `${Math.ceil(ply / 2)}${ply % 2 ? '.' : '…'} ${san}`;
}
