// The board: chessground for drawing and input, chess.js for the rules (legal moves,
// SAN, FEN, PGN). No move generation of our own.

import { Chessground } from 'chessground';
import { Chess, SQUARES } from 'chess.js';

// legalDests maps each square to the squares its piece may move to.
export function legalDests(chess) {
  const dests = new Map();
  for (const sq of SQUARES) {
    const ms = chess.moves({ square: sq, verbose: true });
    if (ms.length) dests.set(sq, ms.map((m) => m.to));
  }
  return dests;
}

const color = (chess) => (chess.turn() === 'w' ? 'white' : 'black');

// makeBoard draws a board in el. onMove(from, to) is called for a move made on it;
// without onMove the board only shows.
export function makeBoard(el, { onMove, orientation = 'white' } = {}) {
  const cg = Chessground(el, {
    orientation,
    coordinates: true,
    viewOnly: !onMove,
    animation: { enabled: true, duration: 150 },
    movable: { free: false, color: 'white', showDests: true, events: { after: (from, to) => onMove?.(from, to) } },
    premovable: { enabled: false },
    drawable: { enabled: false, visible: true },
  });
  // chessground measures its container: measure again when the layout changes it.
  let width = 0;
  const ro = new ResizeObserver(() => {
    if (el.clientWidth !== width) {
      width = el.clientWidth;
      cg.redrawAll();
    }
  });
  ro.observe(el);
  const keys = onMove ? keyboard(el, cg) : null;
  return {
    cg,
    // live is where the keyboard's moves are announced: place it beside the board
    // (chessground owns the board element's children).
    live: keys?.live,
    // show puts chess's position on the board; lastMove is [from, to] or undefined.
    show(chess, lastMove, shapes = []) {
      cg.set({
        fen: chess.fen(),
        turnColor: color(chess),
        check: chess.inCheck(),
        lastMove,
        movable: onMove ? { color: chess.isGameOver() ? undefined : color(chess), dests: legalDests(chess) } : {},
      });
      cg.setAutoShapes(shapes);
    },
    flip() {
      cg.toggleOrientation();
    },
    destroy() {
      ro.disconnect();
      cg.destroy();
    },
  };
}

// keyboard makes a board playable without a pointer: the board takes focus, the arrow
// keys move a cursor over the squares (as the board is turned), Enter or Space picks
// the piece under it up and puts it down (chessground's own selection, so a move goes
// through the same legality and onMove as a click), Escape drops it. What the cursor
// is on is announced in a polite live region.
function keyboard(el, cg) {
  const files = 'abcdefgh';
  let cursor = cg.state.orientation === 'white' ? 'a1' : 'h8';
  const live = document.createElement('p');
  live.className = 'sr-only';
  live.setAttribute('aria-live', 'polite');
  live.dataset.testid = 'board-live';
  el.tabIndex = 0;
  el.setAttribute('role', 'application');
  el.setAttribute('aria-label', 'Chess board. Arrow keys move across the squares; Enter or Space picks a piece up and puts it down; Escape drops it.');
  const mark = (on) => cg.set({ highlight: { custom: new Map(on ? [[cursor, 'kb-cursor']] : []) } });
  const announce = () => {
    const piece = cg.state.pieces.get(cursor);
    const held = cg.state.selected;
    live.textContent = `${cursor}${piece ? `, ${piece.color} ${piece.role}` : ', empty'}${held ? `; holding the piece from ${held}` : ''}`;
  };
  const step = (df, dr) => {
    const w = cg.state.orientation === 'white' ? 1 : -1;
    const f = files.indexOf(cursor[0]) + df * w;
    const r = Number(cursor[1]) + dr * w;
    if (f < 0 || f > 7 || r < 1 || r > 8) return;
    cursor = files[f] + r;
    mark(true);
    announce();
  };
  el.addEventListener('keydown', (e) => {
    switch (e.key) {
      case 'ArrowUp': step(0, 1); break;
      case 'ArrowDown': step(0, -1); break;
      case 'ArrowLeft': step(-1, 0); break;
      case 'ArrowRight': step(1, 0); break;
      case 'Enter':
      case ' ':
        cg.selectSquare(cursor);
        mark(true);
        announce();
        break;
      case 'Escape':
        cg.selectSquare(null);
        announce();
        break;
      default:
        return;
    }
    e.preventDefault();
  });
  el.addEventListener('focus', () => { mark(true); announce(); });
  el.addEventListener('blur', () => mark(false));
  return { live };
}

// arrow is a drawn move (UCI) for setAutoShapes.
export function arrow(uci, brush = 'paleBlue') {
  if (!uci || uci.length < 4) return null;
  return { orig: uci.slice(0, 2), dest: uci.slice(2, 4), brush };
}

export { Chess };
