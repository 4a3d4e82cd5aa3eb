package service

import (
	"io"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"weida.dev/connector/service/admin"
)

// The status page of a replica with placement shows, per resource, the
// placement its /status reports: here a resource another replica holds
// and one nobody holds, as the placed runtime reports them.
func TestPlacedStatusPage(t *testing.T) {
	p, reg := standbyReplica(map[string]string{})
	rec := httptest.NewRecorder()
	admin.Handler(p, reg, admin.Options{}).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	b, _ := io.ReadAll(rec.Result().Body)
	if rec.Code != 200 {
		t.Fatalf("GET / = %d\n%s", rec.Code, b)
	}
	body := string(b)
	rows := regexp.MustCompile(`(?s)<div class="placement" data-f="placement.row">.*?</div>`).FindAllString(body, -1)
	tags := regexp.MustCompile(`<[^>]*>`)
	var got []string
	for _, r := range rows {
		got = append(got, strings.Join(strings.Fields(tags.ReplaceAllString(r, " ")), " "))
	}
	want := []string{
		"Placement standby · holder r1 · epoch — · standbys r0 , r2",
		"Placement unheld · holder none · epoch — · standbys r0 , r1 , r2",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("placement rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
