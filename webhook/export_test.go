package webhook

import "time"

// SetExpireBatch makes Expire delete in batches of n deliveries until the test ends.
func SetExpireBatch(t interface{ Cleanup(func()) }, n int) {
	old := expireBatch
	expireBatch = n
	t.Cleanup(func() { expireBatch = old })
}

// ExpireStatement is Expire's statement and its arguments for age.
func ExpireStatement(age time.Duration) (string, []any) {
	return expireSQL, []any{expireBatch, age.Seconds()}
}
