package domain

// Endpoint names a costed endpoint.
type Endpoint string

const (
	EndpointEval     Endpoint = "eval"
	EndpointBestMove Endpoint = "bestmove"
	EndpointAnalyze  Endpoint = "analyze"
	EndpointBatch    Endpoint = "batch"
)

// ParseEndpoint accepts the four costed endpoints.
func ParseEndpoint(s string) (Endpoint, bool) {
	switch e := Endpoint(s); e {
	case EndpointEval, EndpointBestMove, EndpointAnalyze, EndpointBatch:
		return e, true
	}
	return "", false
}

// Call describes a costed call: what ledger.Quote prices it by. Positions is 1 for eval
// and bestmove, the number of FENs for batch and of plies for analyze. MoveTimeMS is 0
// when not given.
type Call struct {
	Endpoint   Endpoint
	Depth      int
	MultiPV    int
	MoveTimeMS int
	Positions  int
}
