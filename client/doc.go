// Package client is the Go client of the chessd API, generated from the OpenAPI
// document (openapi/openapi.yaml) by oapi-codegen: client.gen.go is never edited by
// hand; generate_test.go fails when it differs from a fresh generation.
//
//	c, err := client.NewClientWithResponses("http://localhost:8080/v1", client.WithKey(key))
//	res, err := c.EvalWithResponse(ctx, nil, client.EvalRequest{Fen: fen, Depth: &depth})
//	fmt.Println(res.JSON200.Eval, *res.JSON200.BestmoveSan)
//
// Beside the generated code: WithKey (the bearer key), Problem's error form, and
// ReadStream for the live evaluation stream (docs/API.md, "Live evaluation").
package client

//go:generate go tool oapi-codegen -config oapi-codegen.yaml -o client.gen.go ../openapi/openapi.yaml
