package main

import (
	"fmt"
	"strings"
	"time"
)

// nullAll runs the paired comparison with a raw process on both sides, in rounds of
// fresh processes: what the paired part's ratio reads for a service that costs
// nothing. The spread of its ratio from round to round is the finest difference one
// run of the paired part can tell on this machine.
func (b *bench) nullAll(depths string, nPairs, rounds int) error {
	fresh := freshPositions()
	fmt.Printf("## Raw Stockfish against raw Stockfish (the paired part's null)\n\n")
	fmt.Println("Two raw processes A and B, both as the paired part's raw side (position + go, timed; ucinewgame and isready after, untimed),")
	fmt.Println("search each position in turn, alternating which goes first; fresh processes each round. B / A = median over pairs of B's time")
	fmt.Println("over A's, with its 95 % interval; own count: median over pairs of B's info time minus A's; nodes: pairs whose node counts differ.")
	fmt.Println()
	fmt.Println("| depth | round | pairs | A median ms | B median ms | **B / A, median pair ratio** | own count B − A ms | nodes differ |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, d := range strings.Split(depths, ",") {
		var depth int
		fmt.Sscan(d, &depth)
		for r := range rounds {
			n, err := b.null(depth, fresh[:min(nPairs, len(fresh))])
			if err != nil {
				return err
			}
			fmt.Printf("| %d | %d | %d | %.1f | %.1f | **%.3f**%s | %+.1f | %d |\n", depth, r+1, len(n.a),
				ms(median(n.a)), ms(median(n.b)), medianFloat(n.ratios), interval(n.ratios, "%.3f"), ms(median(n.own)), n.nodesDiffer)
		}
	}
	fmt.Println()
	return nil
}

// nullPairs is one round of raw against raw: each side's times, B's over A's per
// pair, and B's own count minus A's.
type nullPairs struct {
	a, b, own   []time.Duration
	ratios      []float64
	nodesDiffer int
}

// null searches work on two fresh raw processes, alternating which goes first.
func (b *bench) null(depth int, work []string) (*nullPairs, error) {
	var engs [2]*rawEngine
	for i := range engs {
		e, err := startRaw(b.binary)
		if err != nil {
			return nil, err
		}
		defer e.close()
		engs[i] = e
	}
	var n nullPairs
	for i, fen := range work {
		first, second := i%2, 1-i%2
		var t [2]time.Duration
		t[first] = engs[first].search(fen, depth)
		t[second] = engs[second].search(fen, depth)
		n.a, n.b = append(n.a, t[0]), append(n.b, t[1])
		n.own = append(n.own, time.Duration(engs[1].timeMS-engs[0].timeMS)*time.Millisecond)
		if engs[0].nodes != engs[1].nodes {
			n.nodesDiffer++
		}
	}
	n.ratios = pairRatios(n.b, n.a)
	return &n, nil
}
