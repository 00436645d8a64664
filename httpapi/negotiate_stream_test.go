package httpapi

import "testing"

func TestStreamMedia(t *testing.T) {
	for _, tc := range []struct{ accept, want string }{
		{"", ""},
		{"application/json", ""},
		{"*/*", ""},
		{"text/*", ""},
		{"text/event-stream", mediaSSE},
		{"application/x-ndjson", mediaNDJSON},
		{"text/event-stream, */*;q=0.1", mediaSSE},
		{"application/x-ndjson, */*", mediaNDJSON},  // named beats a wildcard at equal q
		{"text/event-stream, application/json", ""}, // JSON named wins the tie
		{"application/json;q=0.5, text/event-stream", mediaSSE},
		{"text/event-stream;q=0.4, application/json;q=0.5", ""},
		{"text/event-stream;q=0, application/x-ndjson;q=0", ""},
		{"application/x-ndjson;q=0.9, text/event-stream;q=0.8", mediaNDJSON},
		{"application/x-ndjson, text/event-stream", mediaSSE},
		{"text/event-stream;q=2", ""}, // an invalid q is ignored
		{"garbage;;, text/event-stream", mediaSSE},
		{"TEXT/EVENT-STREAM", mediaSSE}, // media types are case-insensitive
	} {
		if got := streamMedia(tc.accept); got != tc.want {
			t.Errorf("streamMedia(%q) = %q, want %q", tc.accept, got, tc.want)
		}
	}
}

func FuzzStreamMedia(f *testing.F) {
	for _, s := range []string{"text/event-stream", "application/x-ndjson;q=0.5, */*", "a/b;q=x,,", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, accept string) {
		switch streamMedia(accept) {
		case "", mediaSSE, mediaNDJSON:
		default:
			t.Fatalf("streamMedia(%q) returned an unknown type", accept)
		}
	})
}
