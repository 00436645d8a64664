package commands

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"chessd/postgres"
)

// expireBatch is how many tokens one statement of ExpireTokens deletes (postgres.InBatches).
var expireBatch = 10000

// expireTokensSQL deletes a batch ($1) of the tokens used, or expired unused, more
// than $2 seconds ago, found by migration 0050's index. A token is used only before
// it expires, so coalesce(used_at, expires_at) is when it stopped being usable. The
// ids are read once (ARRAY): joined instead, the planner may rescan the subquery, and
// each rescan takes a batch more.
const expireTokensSQL = `DELETE FROM email_verifications WHERE token_hash = ANY (ARRAY(
	SELECT token_hash FROM email_verifications
	 WHERE coalesce(used_at, expires_at) < now() - make_interval(secs => $2)
	 LIMIT $1 FOR UPDATE SKIP LOCKED))`

// ExpireTokens deletes the verification and key-recovery tokens (email_verifications:
// each with the address it was sent to) used or expired more than age ago, in batches,
// and answers how many it deleted. The limits on messages with a token (mailRoom)
// count the tokens made in the last 24 hours, which expire within a day of being
// made: an age of a day or more leaves every one they count. Any number of servers
// may expire at once, each batch skipping the rows another holds.
func ExpireTokens(ctx context.Context, pool *pgxpool.Pool, age time.Duration) (int64, error) {
	n, err := postgres.InBatches(ctx, pool, expireBatch, expireTokensSQL, age.Seconds())
	if err != nil {
		return n, fmt.Errorf("expire email tokens: %w", err)
	}
	return n, nil
}
