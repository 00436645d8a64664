package client

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestGeneratedIsFresh: client.gen.go is what the pinned generator makes of the
// OpenAPI document today, so the client cannot drift from the document (run `make
// generate` after changing openapi/openapi.yaml).
func TestGeneratedIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	cmd := exec.Command("go", "tool", "oapi-codegen", "-config", "oapi-codegen.yaml", "../openapi/openapi.yaml")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	fresh, err := cmd.Output()
	if err != nil {
		t.Fatalf("oapi-codegen: %v\n%s", err, stderr.Bytes())
	}
	kept, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, kept) {
		t.Fatalf("client/client.gen.go is not what openapi/openapi.yaml generates (%d bytes kept, %d fresh): run `make generate`", len(kept), len(fresh))
	}
}
