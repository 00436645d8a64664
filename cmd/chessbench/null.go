package main

import (
	"fmt"
	"time"
)

// nullAll runs the paired comparison with a raw search on both sides, in rounds: on two
// fresh processes of their own, and on the one process of the service's pool that the
// paired part's raw side is lent (lentSearch). What the paired part reads for a service
// that costs nothing is the second; the first shows what pairing two processes reads.
// The spread of a ratio from round to round is the finest difference one run of the
// paired part can tell on this machine.
func (b *bench) nullAll(depths string, nPairs, rounds int) error {
	fresh := freshPositions()
	fmt.Printf("## Raw Stockfish against raw Stockfish (the paired part's null)\n\n")
	fmt.Println("Two raw sides A and B, both as the paired part's raw side (position + go, timed; ucinewgame and isready after, untimed),")
	fmt.Println("search each position in turn, alternating which goes first, each round on two fresh processes of their own (two processes),")
	fmt.Println("then both on the process of the service's pool the paired part's raw side is lent (one process: what the paired part reads")
	fmt.Println("for a service that costs nothing). B / A = median over pairs of B's time over A's, with its 95 % interval; own count: median")
	fmt.Println("over pairs of B's info time minus A's; nodes: pairs whose node counts differ.")
	fmt.Println()
	fmt.Println("| depth | round | processes | pairs | A median ms | B median ms | **B / A, median pair ratio** | own count B − A ms | nodes differ |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	ds, _ := positiveInts(depths) // checked in run
	for _, depth := range ds {
		for r := range rounds {
			for _, one := range []bool{false, true} {
				n, err := b.null(depth, fresh[:min(nPairs, len(fresh))], one)
				if err != nil {
					return err
				}
				procs := "two"
				if one {
					procs = "one"
				}
				fmt.Printf("| %d | %d | %s | %d | %.1f | %.1f | **%.3f**%s | %+.1f | %d |\n", depth, r+1, procs, len(n.a),
					ms(median(n.a)), ms(median(n.b)), medianFloat(n.ratios), interval(n.ratios, "%.3f"), ms(median(n.own)), n.nodesDiffer)
			}
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

// null searches work on two raw sides, alternating which goes first: two fresh
// processes of their own, or (one) both on the process of the service's pool that
// lentSearch gets.
func (b *bench) null(depth int, work []string, one bool) (*nullPairs, error) {
	var side [2]func(fen string) (rawSearch, error)
	for i := range side {
		if one {
			side[i] = func(fen string) (rawSearch, error) { return b.lentSearch(fen, depth) }
			continue
		}
		e, err := startRaw(b.binary)
		if err != nil {
			return nil, err
		}
		defer e.close()
		side[i] = func(fen string) (rawSearch, error) {
			e.search(fen, depth)
			return e.last, nil
		}
	}
	var n nullPairs
	for i, fen := range work {
		first, second := i%2, 1-i%2
		var s [2]rawSearch
		var err error
		if s[first], err = side[first](fen); err != nil {
			return nil, err
		}
		if s[second], err = side[second](fen); err != nil {
			return nil, err
		}
		n.a, n.b = append(n.a, s[0].took), append(n.b, s[1].took)
		n.own = append(n.own, time.Duration(s[1].timeMS-s[0].timeMS)*time.Millisecond)
		if s[0].nodes != s[1].nodes {
			n.nodesDiffer++
		}
	}
	n.ratios = pairRatios(n.b, n.a)
	return &n, nil
}
