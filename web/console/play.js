// The playground: a board, the engine's settings, and a live evaluation streamed from
// POST /v1/eval (Accept: text/event-stream): each completed depth as it arrives, then
// the answer with what it was charged. Works keyless within the free allowance.

import { api, engines, session, stream, Problem } from './api.js';
import { makeBoard, Chess, arrow } from './board.js';
import { h, replace, field, alertBox, showProblem, showNotice, clearBox, fmtEval, whiteShare, fmtCount, fmtInt, fmtUSD } from './ui.js';

export const title = 'Playground';

const START = new Chess().fen();

// Kept across visits of the page (and a change of key) for this tab's life.
const state = {
  baseFen: START,
  sans: [],
  orientation: 'white',
  settings: { engine: '', depth: 12, movetime: '', multipv: 1, wdl: false, auto: false, promotion: 'q' },
};

export function mount(root) {
  let chess = rebuild();
  let running = null; // the AbortController of the search in flight
  let analysis = null; // {sans, fen, lines, progress, result, log}
  let keylessLimits = null; // GET /engines' keyless limits, for the price line
  let quoteSeq = 0; // the latest price asked: older answers are dropped

  const problems = alertBox();
  const boardEl = h('div', { class: 'board', 'data-testid': 'board' });
  const board = makeBoard(boardEl, { onMove: boardMove, orientation: state.orientation });

  // position controls
  const fenInput = h('input', { type: 'text', name: 'fen', spellcheck: 'false', autocomplete: 'off', 'data-testid': 'fen' });
  const moveInput = h('input', { type: 'text', name: 'move', spellcheck: 'false', autocomplete: 'off', placeholder: 'e4, Nf3, e7e8q', 'data-testid': 'move-input' });
  const pgnInput = h('textarea', { name: 'pgn', rows: 3, spellcheck: 'false', placeholder: '1. e4 e5 2. Nf3 Nc6' });
  const promotion = h('select', { name: 'promotion' },
    [['q', 'Queen'], ['r', 'Rook'], ['b', 'Bishop'], ['n', 'Knight']].map(([v, t]) => h('option', { value: v }, t)));
  promotion.value = state.settings.promotion;
  promotion.onchange = () => { state.settings.promotion = promotion.value; };
  const movesEl = h('ol', { class: 'movelist', 'aria-label': 'Moves played', 'data-testid': 'moves' });
  const status = h('p', { class: 'status', 'aria-live': 'polite', 'data-testid': 'game-status' });

  // engine controls
  const s = state.settings;
  const engineSel = h('select', { name: 'engine', 'data-testid': 'engine' }, h('option', { value: '' }, 'latest (native)'));
  const depthIn = h('input', { type: 'number', name: 'depth', min: 1, max: 30, value: s.depth, 'data-testid': 'depth' });
  const movetimeIn = h('input', { type: 'number', name: 'movetime_ms', min: 50, max: 60000, step: 50, value: s.movetime, placeholder: 'none' });
  const multipvIn = h('input', { type: 'number', name: 'multipv', min: 1, max: 10, value: s.multipv, 'data-testid': 'multipv' });
  const wdlIn = h('input', { type: 'checkbox', name: 'wdl', checked: s.wdl });
  const autoIn = h('input', { type: 'checkbox', name: 'auto', checked: s.auto });
  const analyseBtn = h('button', { type: 'submit', class: 'primary', 'data-testid': 'analyse' }, 'Analyse');
  const stopBtn = h('button', { type: 'button', disabled: true, onclick: () => running?.abort() }, 'Stop');
  const priceEl = h('p', { class: 'price', 'aria-live': 'polite', 'data-testid': 'price' });

  // results
  const barFill = h('div', { class: 'evalbar-white' });
  const bar = h('div', { class: 'evalbar', role: 'img', 'aria-label': 'Evaluation bar' }, barFill);
  const evalEl = h('output', { class: 'eval', 'data-testid': 'eval' }, '–');
  const statsEl = h('dl', { class: 'stats', 'data-testid': 'stats' });
  const linesEl = h('ol', { class: 'lines', 'data-testid': 'lines', 'aria-label': 'Principal variations' });
  const chargeEl = h('p', { class: 'charge', 'data-testid': 'charge' });
  const logBody = h('tbody', { 'data-testid': 'search-log' });
  const logSummary = h('summary', {}, 'Search log');
  const log = h('details', { class: 'search-log' }, logSummary,
    h('table', {}, h('thead', {}, h('tr', {}, ['Depth', 'Eval', 'Nodes', 'Speed', 'Line'].map((c) => h('th', { scope: 'col' }, c)))), logBody));

  const form = h('form', { class: 'engine-form', onsubmit: (e) => { e.preventDefault(); analyse(); } },
    h('div', { class: 'row' },
      field('Engine', engineSel),
      field('Depth', depthIn),
      field('Movetime (ms)', movetimeIn, 'optional: stop at whichever comes first'),
      field('MultiPV', multipvIn)),
    h('div', { class: 'row checks' },
      h('label', {}, wdlIn, ' Win/draw/loss'),
      h('label', {}, autoIn, ' Analyse after each move')),
    h('div', { class: 'row' }, analyseBtn, stopBtn),
    priceEl);
  for (const el of [engineSel, depthIn, movetimeIn, multipvIn, wdlIn, autoIn]) el.addEventListener('change', settingsChanged);

  replace(root,
    h('h1', {}, 'Playground'),
    problems,
    h('div', { class: 'play' },
      h('section', { class: 'board-col', 'aria-label': 'Board' },
        h('div', { class: 'board-wrap' }, bar, boardEl, board.live),
        status,
        h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); typedMove(); } },
          grow(field('Play a move', moveInput, 'SAN or UCI, then Enter')), h('button', { type: 'submit' }, 'Play')),
        h('div', { class: 'row' },
          h('button', { type: 'button', onclick: undo, 'data-testid': 'undo' }, 'Undo'),
          h('button', { type: 'button', onclick: () => setPosition(START, []), 'data-testid': 'start-position' }, 'Start position'),
          h('button', { type: 'button', onclick: () => { board.flip(); state.orientation = board.cg.state.orientation; } }, 'Flip board'),
          field('Promote to', promotion)),
        movesEl),
      h('section', { class: 'panel', 'aria-label': 'Analysis' },
        h('h2', {}, 'Engine'),
        form,
        h('h2', {}, 'Evaluation'),
        h('div', { class: 'eval-row' }, evalEl, statsEl),
        linesEl,
        chargeEl,
        log,
        h('h2', {}, 'Position'),
        h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); loadFen(); } },
          grow(field('FEN', fenInput)), h('button', { type: 'submit' }, 'Set FEN')),
        h('form', { onsubmit: (e) => { e.preventDefault(); loadPgn(); } },
          field('PGN', pgnInput), h('button', { type: 'submit' }, 'Load PGN')))));

  engines().then((e) => {
    for (const v of e.versions) {
      for (const p of v.paths) {
        engineSel.append(h('option', { value: `${v.id}|${p.path}` }, `${p.name} (${v.id}, ${p.path})`));
      }
    }
    engineSel.value = s.engine;
    if (engineSel.value !== s.engine) engineSel.value = '';
    depthIn.max = e.limits.depth.max;
    multipvIn.max = e.limits.multipv.max;
    keylessLimits = e.limits.keyless;
    quote();
  }).catch((err) => showProblem(problems, err));

  redraw();
  if (analysis) showAnalysis();
  quote();

  function rebuild() {
    const c = new Chess(state.baseFen);
    for (const m of state.sans) c.move(m);
    return c;
  }

  function redraw() {
    const hist = chess.history({ verbose: true });
    const last = hist.at(-1);
    // the best move only on the position analysed (base position and moves alike)
    const best = analysis && analysis.fen === chess.fen() ? analysis.lines?.[0]?.moves?.[0] : null;
    board.show(chess, last ? [last.from, last.to] : undefined, [arrow(best)].filter(Boolean));
    fenInput.value = chess.fen();
    const ply0 = new Chess(state.baseFen).turn() === 'w' ? 0 : 1;
    replace(movesEl, hist.map((m, i) => h('li', { value: Math.floor((i + ply0) / 2) + 1, class: (i + ply0) % 2 ? 'black' : 'white' }, m.san)));
    let st = `${chess.turn() === 'w' ? 'White' : 'Black'} to move`;
    if (chess.isCheckmate()) st = `Checkmate: ${chess.turn() === 'w' ? 'Black' : 'White'} wins`;
    else if (chess.isStalemate()) st = 'Stalemate';
    else if (chess.isDraw()) st = 'Draw';
    else if (chess.inCheck()) st += ' (check)';
    status.textContent = st;
  }

  function afterMove() {
    redraw();
    if (state.settings.auto && !chess.isGameOver()) analyse();
  }

  function boardMove(from, to) {
    try {
      const m = chess.move({ from, to, promotion: state.settings.promotion });
      state.sans.push(m.san);
    } catch {
      // chessground only offers chess.js's legal moves; resync if it ever disagrees
    }
    afterMove();
  }

  function typedMove() {
    const text = moveInput.value.trim();
    if (!text) return;
    try {
      const uci = /^[a-h][1-8][a-h][1-8][qrbn]?$/.exec(text);
      const m = uci ? chess.move({ from: text.slice(0, 2), to: text.slice(2, 4), promotion: text[4] }) : chess.move(text);
      state.sans.push(m.san);
      moveInput.value = '';
      clearBox(problems);
      afterMove();
    } catch {
      showNotice(problems, `"${text}" is not a legal move here.`);
    }
  }

  function undo() {
    if (!state.sans.length) return;
    state.sans.pop();
    chess = rebuild();
    redraw();
  }

  function setPosition(fen, sans) {
    state.baseFen = fen;
    state.sans = sans;
    chess = rebuild();
    clearBox(problems);
    // A new position (Set FEN, Start position, Load PGN) drops the old analysis: its
    // evaluation and lines belong to another game. Moves played keep it (its lines
    // stay playable from where it was analysed).
    if (analysis && analysis.fen !== chess.fen()) clearAnalysis();
    redraw();
  }

  function clearAnalysis() {
    running?.abort();
    analysis = null;
    evalEl.textContent = '–';
    barFill.style.height = '';
    bar.setAttribute('aria-label', 'Evaluation bar');
    logSummary.textContent = 'Search log';
    for (const el of [statsEl, linesEl, chargeEl, logBody]) replace(el);
  }

  function loadFen() {
    try {
      const c = new Chess(fenInput.value.trim());
      setPosition(c.fen(), []);
    } catch (err) {
      showNotice(problems, `Not a usable FEN: ${err.message}`);
    }
  }

  function loadPgn() {
    try {
      const c = new Chess();
      c.loadPgn(pgnInput.value);
      const hist = c.history();
      const header = c.getHeaders ? c.getHeaders() : c.header();
      setPosition(header.FEN ? new Chess(header.FEN).fen() : START, hist);
    } catch (err) {
      showNotice(problems, `Not a usable PGN: ${err.message}`);
    }
  }

  function settingsChanged() {
    Object.assign(state.settings, {
      engine: engineSel.value, depth: +depthIn.value || 12, movetime: movetimeIn.value,
      multipv: +multipvIn.value || 1, wdl: wdlIn.checked, auto: autoIn.checked,
    });
    quote();
  }

  function request() {
    const [engine, path] = s.engine ? s.engine.split('|') : [];
    const body = { fen: chess.fen(), depth: s.depth, multipv: s.multipv };
    if (engine) Object.assign(body, { engine, path });
    if (s.movetime) body.movetime_ms = +s.movetime;
    if (s.wdl) body.options = { show_wdl: true };
    return body;
  }

  // quote shows the price before the call: GET /price with a key; the keyless rules without.
  function quote() {
    const seq = ++quoteSeq;
    if (!session.key) {
      const k = keylessLimits;
      replace(priceEl, 'Keyless: free, ', k ? `${k.calls_per_day} calls a day, depth ≤ ${k.max_depth}, MultiPV ≤ ${k.max_multipv}` : 'within the daily allowance',
        '. Enter a key for deeper searches.');
      return;
    }
    api('GET', '/price', { query: { endpoint: 'eval', depth: s.depth, multipv: s.multipv, movetime_ms: s.movetime || undefined } })
      .then((p) => {
        if (seq !== quoteSeq) return;
        replace(priceEl, 'Price: ', h('strong', { 'data-testid': 'price-units' }, `${p.units} units`), ` (${fmtUSD(p.usd)}); from the cache ${p.cached_units} units (${fmtUSD(p.cached_usd)})`);
      })
      .catch((err) => {
        if (seq !== quoteSeq) return;
        replace(priceEl, `No price: ${err instanceof Problem ? err.doc.detail || err.doc.title : err.message}`);
      });
  }

  async function analyse() {
    running?.abort();
    const ctl = new AbortController();
    running = ctl;
    clearBox(problems);
    const body = request();
    analysis = { sans: state.sans.slice(), baseFen: state.baseFen, fen: body.fen, lines: [], progress: null, result: null, log: [] };
    replace(logBody);
    replace(chargeEl, 'Searching…');
    analyseBtn.disabled = true;
    stopBtn.disabled = false;
    const mine = analysis;
    try {
      await stream('POST', '/eval', {
        body,
        signal: ctl.signal,
        onEvent: (name, data) => {
          if (mine !== analysis) return;
          if (name === 'depth') {
            mine.progress = data;
            mine.lines = data.pvs;
            mine.log.push(data);
            showAnalysis();
          } else if (name === 'result') {
            mine.result = data;
            mine.lines = data.pvs;
            showAnalysis();
          } else if (name === 'error') {
            throw new Problem(data, data.status);
          }
        },
      });
      if (!mine.result && !ctl.signal.aborted) replace(chargeEl, 'The stream ended without an answer; try again.');
    } catch (err) {
      if (ctl.signal.aborted) {
        if (mine === analysis) replace(chargeEl, 'Stopped: a search stopped before its answer is not charged.');
      } else {
        replace(chargeEl);
        showProblem(problems, err);
      }
    } finally {
      if (running === ctl) {
        running = null;
        analyseBtn.disabled = false;
        stopBtn.disabled = true;
      }
    }
  }

  // showAnalysis draws the latest depth or the answer.
  function showAnalysis() {
    const a = analysis;
    const r = a.result;
    const p = r || a.progress;
    if (!p) return;
    const score = p.eval;
    evalEl.textContent = fmtEval(score);
    barFill.style.height = `${(whiteShare(score) * 100).toFixed(1)}%`;
    bar.setAttribute('aria-label', `Evaluation ${fmtEval(score)} (White's view)`);
    const wdl = (r ? r.pvs?.[0]?.wdl : p.wdl) || null;
    const nps = r ? (r.time_ms ? Math.round((r.nodes * 1000) / r.time_ms) : null) : p.nps;
    replace(statsEl,
      h('dt', {}, 'Depth'), h('dd', { 'data-testid': 'depth-reached' }, `${p.depth}/${p.seldepth ?? '–'}`),
      h('dt', {}, 'Nodes'), h('dd', {}, fmtCount(p.nodes)),
      h('dt', {}, 'Speed'), h('dd', {}, nps ? `${fmtCount(nps)} nodes/s` : '–'),
      h('dt', {}, 'Time'), h('dd', {}, `${fmtInt(p.time_ms)} ms`),
      wdl ? [h('dt', {}, 'W/D/L'), h('dd', {}, `${(wdl.w / 10).toFixed(1)} / ${(wdl.d / 10).toFixed(1)} / ${(wdl.l / 10).toFixed(1)} %`)] : null);
    const start = new Chess(a.fen);
    const moveNo = (i) => {
      const ply = (start.moveNumber() - 1) * 2 + (start.turn() === 'w' ? 0 : 1) + i;
      const n = Math.floor(ply / 2) + 1;
      return ply % 2 === 0 ? `${n}.` : i === 0 ? `${n}…` : '';
    };
    replace(linesEl, (a.lines || []).map((line, li) => h('li', { 'data-testid': 'pv' },
      h('span', { class: 'line-eval' }, fmtEval(line.eval)),
      ' ',
      line.moves_san.map((san, i) => [moveNo(i) ? h('span', { class: 'muted' }, `${moveNo(i)} `) : null,
        h('button', { type: 'button', class: 'move', 'data-testid': 'pv-move', 'aria-label': `Play line ${li + 1} up to ${san}`, onclick: () => playLine(line, i) }, san), ' ']))));
    if (a.log.length) {
      const d = a.log.at(-1);
      logSummary.textContent = `Search log (${a.log.length} depths, last ${d.depth})`;
      while (logBody.children.length < a.log.length) {
        const e = a.log[logBody.children.length];
        logBody.append(h('tr', { 'data-depth': e.depth }, h('td', {}, e.depth), h('td', {}, fmtEval(e.eval)), h('td', {}, fmtCount(e.nodes)),
          h('td', {}, e.nps ? `${fmtCount(e.nps)}/s` : '–'), h('td', {}, (e.pvs?.[0]?.moves_san || []).slice(0, 6).join(' '))));
      }
    }
    if (r) {
      const note = session.key ? '' : ' (keyless: free)';
      replace(chargeEl, 'Charged ', h('strong', { 'data-testid': 'charged-units' }, `${r.cost_units} units`), ` (${fmtUSD(r.cost_usd)})${note}`,
        `; priced ${r.price_units} units (${fmtUSD(r.price_usd)})`, r.cached ? ', served from the cache' : '', `. ${r.engine_name}, ${r.path}.`);
    }
    redraw();
  }

  // playLine plays a PV line on the board, from the analysed position to its i-th move.
  function playLine(line, i) {
    const a = analysis;
    state.baseFen = a.baseFen;
    state.sans = a.sans.slice();
    chess = rebuild();
    for (const uci of line.moves.slice(0, i + 1)) {
      const m = chess.move({ from: uci.slice(0, 2), to: uci.slice(2, 4), promotion: uci[4] });
      state.sans.push(m.san);
    }
    afterMove();
  }

  return () => {
    running?.abort();
    board.destroy();
  };
}

function grow(el) {
  el.classList.add('grow');
  return el;
}
