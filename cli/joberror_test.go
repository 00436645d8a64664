package cli

import (
	"encoding/json"
	"testing"

	"chessd/client"
)

// A failed job's error reads as the problem it is, and as the {code, message} a server
// of the release before sent (decoded as a problem, it printed "error: 0 : (budget;
// next: )", its message lost).
func TestJobErrorLine(t *testing.T) {
	cases := []struct{ body, want string }{
		{`{"type":"http://x/v1/problems/invalid-credential","title":"Invalid API key","status":401,"detail":"the job's key was revoked","next_action":"fix_request","code":"bad_credential","message":"the job's key was revoked"}`,
			"error: 401 Invalid API key: the job's key was revoked (bad_credential; next: fix_request)"},
		{`{"code":"budget","message":"the key's units budget is spent"}`, "error: budget: the key's units budget is spent"},
	}
	for _, c := range cases {
		var p client.JobProblem
		if err := json.Unmarshal([]byte(c.body), &p); err != nil {
			t.Fatal(err)
		}
		if got := jobErrorLine(&p); got != c.want {
			t.Errorf("%s\n got %q\nwant %q", c.body, got, c.want)
		}
	}
}
