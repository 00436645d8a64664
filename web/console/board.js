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
  return {
    cg,
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

// arrow is a drawn move (UCI) for setAutoShapes.
export function arrow(uci, brush = 'paleBlue') {
  if (!uci || uci.length < 4) return null;
  return { orig: uci.slice(0, 2), dest: uci.slice(2, 4), brush };
}

export { Chess };
