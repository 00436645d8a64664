package webhook

import (
	"errors"
	"fmt"

	"chessd/domain"
)

// Secrets seals endpoints' signing secrets for the database (a domain.Sealer under the
// service's key pepper, CHESSD_KEY_PEPPER), so that a copy of the database cannot sign
// deliveries. A sealed secret is bound to its endpoint's id: moved to another row, it
// does not open. A secret not in sealed form was stored before secrets were sealed
// (migration 0021's rows) and is used as it is.
type Secrets struct{ sealer *domain.Sealer }

// ErrSecretSealed says a stored secret does not open under this server's pepper.
var ErrSecretSealed = errors.New("webhook: the endpoint's secret does not open with this server's key pepper")

// NewSecrets derives the sealing key from pepper.
func NewSecrets(pepper []byte) (*Secrets, error) {
	if len(pepper) == 0 {
		return nil, errors.New("webhook: no key pepper to seal secrets with")
	}
	// the label keeps the key the secrets were sealed under before domain.Sealer
	sealer, err := domain.NewSealer(pepper, "chessd webhook secrets v1")
	if err != nil {
		return nil, fmt.Errorf("webhook secrets: %w", err)
	}
	return &Secrets{sealer: sealer}, nil
}

func (s *Secrets) seal(secret, endpointID string) string { return s.sealer.Seal(secret, endpointID) }

func (s *Secrets) open(stored, endpointID string) (string, error) {
	if !domain.IsSealed(stored) {
		return stored, nil
	}
	if s == nil {
		return "", ErrSecretSealed
	}
	plain, err := s.sealer.Open(stored, endpointID)
	if err != nil {
		return "", ErrSecretSealed
	}
	return plain, nil
}
