// Drives `chessd uci` with node-uci (web/package.json), a UCI client written by
// others: process.argv[2] is the engine executable. Prints what it saw as one JSON
// object; uci_test.go checks it.
const { Engine } = require('node-uci')

async function main() {
  const engine = new Engine(process.argv[2])
  await engine.init()
  const out = { id: engine.id, options: Object.fromEntries(engine.options) }

  // 1. A position analysed with MultiPV 2 to depth 12.
  await engine.setoption('MultiPV', '2')
  await engine.isready()
  await engine.position('r1bqkbnr/pppp1ppp/2n5/1B2p3/4P3/5N2/PPPP1PPP/RNBQK2R b KQkq - 3 3')
  out.analysis = await engine.go({ depth: 12 })

  // 2. A short game: the engine plays both sides, 6 plies at depth 8.
  await engine.setoption('MultiPV', '1')
  await engine.ucinewgame()
  const moves = []
  out.game = []
  for (let i = 0; i < 6; i++) {
    await engine.position('startpos', moves)
    const r = await engine.go({ depth: 8 })
    out.game.push({ bestmove: r.bestmove, infos: r.info.filter(x => x.depth).length })
    moves.push(r.bestmove)
  }

  // 3. An infinite search, stopped after its third depth.
  await engine.position('startpos', moves)
  const depths = []
  const emitter = engine.goInfinite()
  await new Promise(resolve => emitter.on('data', d => {
    if (d.depth && d.pv) depths.push(d.depth)
    if (depths.length === 3) resolve()
  }))
  const stopped = await engine.stop()
  out.infinite = { moves, depths, bestmove: stopped.bestmove }
  await engine.quit()
  console.log(JSON.stringify(out))
}

main().catch(err => {
  console.error(err)
  process.exit(1)
})
