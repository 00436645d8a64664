// Command eval evaluates one position with the generated Go client (package client):
//
//	CHESSD_KEY=ce_test_… go run ./examples/eval -server http://localhost:8080/v1 \
//	  -depth 12 'rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1'
//
// Without a key it uses the keyless allowance (depth ≤ 12).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"chessd/client"
)

func main() {
	server := flag.String("server", "http://localhost:8080/v1", "the API's base address")
	depth := flag.Int("depth", 12, "search depth")
	flag.Parse()
	fen := strings.Join(flag.Args(), " ")
	if fen == "" {
		fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
	}

	c, err := client.NewClientWithResponses(*server, client.WithKey(os.Getenv("CHESSD_KEY")))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.EvalWithResponse(ctx, nil, client.EvalRequest{Fen: fen, Depth: depth})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Check(res.HTTPResponse, res.Body); err != nil {
		log.Fatal(err) // a problem+json answer: "402 Payment required: …"
	}
	ev := res.JSON200
	best := "(none: the game is over)"
	if ev.BestmoveSan != nil {
		best = *ev.BestmoveSan
	}
	fmt.Printf("%s %d (White's view) at depth %d, best move %s, charged %d units\n",
		ev.Eval.Type, ev.Eval.Value, ev.Depth, best, ev.CostUnits)
}
