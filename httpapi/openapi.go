package httpapi

import (
	"net/http"

	"chessd/domain"
	"chessd/openapi"
)

// The OpenAPI document and its reference page (package openapi): public, cacheable
// with an ETag.

func (s *Server) openAPIJSON(w http.ResponseWriter, r *http.Request) {
	f, err := openapi.JSON()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	openapi.Serve(w, r, f, "public, max-age=300")
}

func (s *Server) openAPIYAML(w http.ResponseWriter, r *http.Request) {
	openapi.Serve(w, r, openapi.YAML(), "public, max-age=300")
}

// docsPage is the reference page, at /v1/docs and /docs: its script and the document
// come from this server, and its Content-Security-Policy allows nothing else.
func (s *Server) docsPage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", openapi.DocsCSP)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	openapi.Serve(w, r, openapi.DocsPage("/v1"), "no-cache")
}

func (s *Server) docsAsset(w http.ResponseWriter, r *http.Request) {
	f, ok := openapi.Asset(pathVar(r, "file"))
	if !ok {
		s.writeError(w, r, domain.Errorf(domain.CodeNotFound, "no file %q of the reference page (a binary built without `make web` has none)", pathVar(r, "file")))
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	openapi.Serve(w, r, f, "public, max-age=3600")
}
