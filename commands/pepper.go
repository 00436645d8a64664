package commands

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"chessd/eventstore"
)

// PepperFingerprint names a pepper without revealing it: an HMAC of a fixed label.
func PepperFingerprint(pepper []byte) string {
	m := hmac.New(sha256.New, pepper)
	m.Write([]byte("chessd key pepper fingerprint v1"))
	return hex.EncodeToString(m.Sum(nil))[:16]
}

// ErrPepperMismatch says this process's pepper is not the one the database's keys were
// hashed under.
var ErrPepperMismatch = fmt.Errorf("CHESSD_KEY_PEPPER differs from the pepper this database's API keys were hashed under")

// ClaimPepper records the pepper's fingerprint on first use and refuses a process whose
// pepper differs: such a server would answer 401 to every valid key. Every replica of
// the service must share CHESSD_KEY_PEPPER.
func ClaimPepper(ctx context.Context, q eventstore.Querier, pepper []byte) error {
	mine := PepperFingerprint(pepper)
	var recorded string
	var err error
	for range 2 { // a claim committed by another server during ours is seen on the second try
		err = q.QueryRow(ctx, `WITH claim AS (
				INSERT INTO service_settings (name, value) VALUES ('key_pepper_fingerprint', $1)
				ON CONFLICT (name) DO NOTHING RETURNING value)
			SELECT value FROM claim UNION ALL SELECT value FROM service_settings WHERE name = 'key_pepper_fingerprint'
			LIMIT 1`, mine).Scan(&recorded)
		if !errors.Is(err, pgx.ErrNoRows) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("claim the key pepper: %w", err)
	}
	if recorded != mine {
		return fmt.Errorf("%w (database: fingerprint %s, this process: %s); set the same CHESSD_KEY_PEPPER on every server and worker",
			ErrPepperMismatch, recorded, mine)
	}
	return nil
}
