package domain

import (
	"fmt"
	"maps"

	gojson "github.com/goccy/go-json"
)

// Event is a past-tense fact. Its type name and schema version are part of the stored
// schema: never rename one, add a new version and an upcaster instead.
type Event interface {
	EventType() string
}

// Stream types and the streams' ids.
const (
	StreamAccount = "account"
	StreamKey     = "key"
	StreamEmail   = "email" // claims an e-mail address, so two accounts cannot share one
)

func AccountStream(id string) string { return "account-" + id }
func KeyStream(id string) string     { return "key-" + id }
func EmailStream(hash string) string { return "email-" + hash }

// decoders build an empty event of each stored type. Old schema versions would be
// upcast here; every type is at version 1 so far.
var decoders = map[string]func() Event{
	"AccountCreated": func() Event { return &AccountCreated{} },
	"EmailClaimed":   func() Event { return &EmailClaimed{} },
	"KeyCreated":     func() Event { return &KeyCreated{} },
	"KeyUpdated":     func() Event { return &KeyUpdated{} },
	"KeyRotated":     func() Event { return &KeyRotated{} },
	"KeyRevoked":     func() Event { return &KeyRevoked{} },
}

// RegisterEvent adds an event type to the decoder table (for the packages of later
// capabilities that keep their events beside their aggregates).
func RegisterEvent(name string, make func() Event) { decoders[name] = make }

// Registered lists every event type Decode knows, each with a constructor of its
// empty value (the tests hold Decode to encoding/json on each).
func Registered() map[string]func() Event { return maps.Clone(decoders) }

// Decode turns a stored payload back into its event.
func Decode(eventType string, schemaVersion int, payload []byte) (Event, error) {
	mk, ok := decoders[eventType]
	if !ok {
		return nil, fmt.Errorf("unknown event type %q", eventType)
	}
	if schemaVersion != 1 {
		return nil, fmt.Errorf("%s: no upcaster for schema version %d", eventType, schemaVersion)
	}
	e := mk()
	// goccy/go-json reads what encoding/json wrote, three to four times faster: a
	// rebuild, an audit and every projection decode each event they apply
	if err := gojson.Unmarshal(payload, e); err != nil {
		return nil, fmt.Errorf("decode %s: %w", eventType, err)
	}
	return e, nil
}
