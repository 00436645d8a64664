package httpapi

import (
	"encoding/json"
	"testing"
	"time"

	"chessd/webhook"
)

// A delivery's times are shown in UTC, whatever zone the server runs in (pgx reads
// timestamptz in time.Local: delivered_at was shown as "…+01:00"), and next_attempt_at
// only while a try is to come (a failed delivery showed one that never would be, a
// delivered one its last claim's lapse).
func TestDeliveryRecordTimes(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	at := time.Date(2026, 11, 22, 11, 4, 5, 123456000, cet)
	const utc = "2026-11-22T10:04:05.123456Z"
	status, failed := 500, "HTTP 500"
	for _, tc := range []struct {
		name string
		d    webhook.Delivery
		want map[string]any
	}{
		{"delivered", webhook.Delivery{ID: "whd_1", Attempts: 1, CreatedAt: at, DeliveredAt: &at, NextAttemptAt: at},
			map[string]any{"state": "delivered", "created_at": utc, "delivered_at": utc, "next_attempt_at": nil}},
		{"pending", webhook.Delivery{ID: "whd_2", CreatedAt: at, NextAttemptAt: at},
			map[string]any{"state": "pending", "created_at": utc, "delivered_at": nil, "next_attempt_at": utc}},
		{"failed", webhook.Delivery{ID: "whd_3", Attempts: 8, CreatedAt: at, FailedAt: &at, LastStatus: &status, LastError: &failed, NextAttemptAt: at},
			map[string]any{"state": "failed", "delivered_at": nil, "next_attempt_at": nil, "last_error": failed}},
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
