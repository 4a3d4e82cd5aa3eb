package admin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/service/admin"
)

// ExampleRequireToken puts the admin handler behind a token file: the
// probes answer anyone, the rest only a request with the token.
func ExampleRequireToken() {
	dir, err := os.MkdirTemp("", "admin-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("example-token\n"), 0o600); err != nil {
		panic(err)
	}
	tokens, err := admin.OpenTokenFile(file, nil)
	if err != nil {
		panic(err)
	}

	reg := prometheus.NewRegistry()
	rt := connectors.NewRuntime(connectors.Deps{Metrics: connectors.NewMetrics(reg)})
	defer rt.Stop()
	h := admin.RequireToken(admin.Handler(rt, reg, admin.Options{TokenRequired: true}), tokens)

	for _, r := range []struct{ path, auth string }{
		{"/healthz", ""},
		{"/metrics", ""},
		{"/metrics", "Bearer example-token"},
	} {
		req := httptest.NewRequest(http.MethodGet, r.path, nil)
		if r.auth != "" {
			req.Header.Set("Authorization", r.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(r.path, r.auth != "", rec.Code)
	}
	// Output:
	// /healthz false 200
	// /metrics false 401
	// /metrics true 200
}
