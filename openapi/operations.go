package openapi

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	yaml "github.com/pb33f/go-yaml"
)

// An Operation is what the document declares of one method on one path: the query
// parameters it takes and whether it takes a request body. The HTTP layer refuses the
// rest (an undeclared or repeated query parameter, a body where none is declared), so
// that the document is the one list of what each operation reads.
type Operation struct {
	Method string   // GET, POST, PATCH, DELETE, ...
	Path   string   // the document's path, under the server's /v1: /jobs/{id}
	Query  []string // the query parameters' names, in the document's order
	Body   bool     // a requestBody is declared (required or not)
}

// Operations lists the document's operations, sorted by path and method. It fails when
// the document declares what the rule cannot hold to: a query parameter whose schema is
// an array (one given twice would be meant), or a parameter $ref that does not resolve.
func Operations() ([]Operation, error) { return operations() }

var operations = sync.OnceValues(func() ([]Operation, error) { return parseOperations(source) })

// docParameter is a Parameter Object, or a reference to one in components.parameters.
type docParameter struct {
	Ref    string `yaml:"$ref"`
	Name   string `yaml:"name"`
	In     string `yaml:"in"`
	Schema struct {
		Type any `yaml:"type"` // a string, or a list of them (3.1)
	} `yaml:"schema"`
}

type docOperation struct {
	Parameters  []docParameter `yaml:"parameters"`
	RequestBody map[string]any `yaml:"requestBody"`
}

var methods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func parseOperations(src []byte) ([]Operation, error) {
	var doc struct {
		Paths      map[string]map[string]yaml.Node `yaml:"paths"`
		Components struct {
			Parameters map[string]docParameter `yaml:"parameters"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, fmt.Errorf("openapi.yaml: %w", err)
	}
	resolve := func(p docParameter) (docParameter, error) {
		if p.Ref == "" {
			return p, nil
		}
		name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/")
		c, found := doc.Components.Parameters[name]
		if !ok || !found || c.Ref != "" {
			return p, fmt.Errorf("openapi.yaml: parameter %s does not resolve", p.Ref)
		}
		return c, nil
	}
	var out []Operation
	for path, item := range doc.Paths {
		var shared []docParameter
		if n, ok := item["parameters"]; ok {
			if err := n.Decode(&shared); err != nil {
				return nil, fmt.Errorf("openapi.yaml: %s: parameters: %w", path, err)
			}
		}
		for _, m := range methods {
			n, ok := item[m]
			if !ok {
				continue
			}
			var op docOperation
			if err := n.Decode(&op); err != nil {
				return nil, fmt.Errorf("openapi.yaml: %s %s: %w", strings.ToUpper(m), path, err)
			}
			o := Operation{Method: strings.ToUpper(m), Path: path, Body: op.RequestBody != nil}
			// the path's parameters, then the operation's, which override one of the
			// same name and location
			var query []docParameter
			for _, p := range slices.Concat(shared, op.Parameters) {
				p, err := resolve(p)
				if err != nil {
					return nil, err
				}
				if p.In != "query" {
					continue
				}
				if isArray(p.Schema.Type) {
					return nil, fmt.Errorf("openapi.yaml: %s %s: query parameter %s is an array: a parameter given twice is refused", o.Method, path, p.Name)
				}
				query = slices.DeleteFunc(query, func(q docParameter) bool { return q.Name == p.Name })
				query = append(query, p)
			}
			for _, p := range query {
				o.Query = append(o.Query, p.Name)
			}
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b Operation) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return strings.Compare(a.Method, b.Method)
	})
	return out, nil
}

func isArray(t any) bool {
	switch t := t.(type) {
	case string:
		return t == "array"
	case []any:
		for _, e := range t {
			if e == "array" {
				return true
			}
		}
	}
	return false
}
