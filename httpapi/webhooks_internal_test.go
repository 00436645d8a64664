package httpapi

import (
	"encoding/json"
	"testing"
	"time"

	"chessd/webhook"
)

// A delivery's times are shown in UTC, whatever zone the server runs in (pgx reads
// timestamptz in time.Local: delivered_at was shown as "…+01:00").
func TestDeliveryRecordTimes(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	at := time.Date(2026, 11, 22, 11, 4, 5, 123456000, cet)
	status := 204
	for _, tc := range []struct {
		name string
		d    webhook.Delivery
		want map[string]any
	}{
		{"delivered", webhook.Delivery{ID: "whd_1", Attempts: 1, CreatedAt: at, DeliveredAt: &at, LastStatus: &status, NextAttemptAt: at},
			map[string]any{"state": "delivered", "created_at": "2026-11-22T10:04:05.123456Z", "delivered_at": "2026-11-22T10:04:05.123456Z"}},
		{"pending", webhook.Delivery{ID: "whd_2", CreatedAt: at, NextAttemptAt: at},
			map[string]any{"state": "pending", "created_at": "2026-11-22T10:04:05.123456Z", "delivered_at": nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(deliveryRecord(tc.d))
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				if got[k] != want {
					t.Errorf("%s = %v, want %v (%s)", k, got[k], want, b)
				}
			}
		})
	}
}
