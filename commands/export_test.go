package commands

import "time"

// SetExpireBatch makes ExpireTokens delete in batches of n tokens until the test ends.
func SetExpireBatch(t interface{ Cleanup(func()) }, n int) {
	old := expireBatch
	expireBatch = n
	t.Cleanup(func() { expireBatch = old })
}

// ExpireTokensStatement is ExpireTokens' statement and its arguments for age.
func ExpireTokensStatement(age time.Duration) (string, []any) {
	return expireTokensSQL, []any{expireBatch, age.Seconds()}
}
