package hcloudroutes

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

func TestServerID(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"hcloud://42", 42, true},
		{"hrobot://42", 0, false},
		{"aws:///i-1", 0, false},
		{"hcloud://x", 0, false},
	}
	for _, c := range cases {
		got, err := serverID(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("serverID(%q) = %d, %v; want %d, ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

// serversAPI answers GET /servers with n servers, 50 a page, counting pages.
func serversAPI(t *testing.T, n int, pages *atomic.Int64) *hcloud.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/servers" {
			http.NotFound(w, r)
			return
		}
		pages.Add(1)
		page := 1
		fmt.Sscan(r.URL.Query().Get("page"), &page)
		last := (n + 49) / 50
		next := "null"
		if page < last {
			next = fmt.Sprint(page + 1)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"servers":[`)
		for i := (page - 1) * 50; i < min(n, page*50); i++ {
			if i > (page-1)*50 {
				fmt.Fprint(w, ",")
			}
			fmt.Fprintf(w, `{"id":%d,"name":"s-%d","private_net":[{"network":1,"ip":"10.0.0.%d"}]}`, 100+i, i, i+2)
		}
		fmt.Fprintf(w, `],"meta":{"pagination":{"page":%d,"per_page":50,"next_page":%s,"last_page":%d,"total_entries":%d}}}`, page, next, last, n)
	}))
	t.Cleanup(srv.Close)
	return hcloud.NewClient(hcloud.WithEndpoint(srv.URL), hcloud.WithToken("t"))
}

func TestServerCacheRefetchesAllOnMissAndKeepsEntriesForTheirMaxAge(t *testing.T) {
	var pages atomic.Int64
	c := newServerCache(serversAPI(t, 120, &pages), DefaultServerCacheMaxAge)
	now := time.Unix(1_800_000_000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()

	// As the CCM since #1269: an empty cache is stale for All, which
	// fetches every page (120 servers: 3).
	if all, err := c.All(ctx, 0); err != nil || len(all) != 120 || pages.Load() != 3 {
		t.Fatalf("All on an empty cache = %d servers, %v, %d pages; want 120, nil, 3", len(all), err, pages.Load())
	}
	// Within its max-age a lookup answers from the cache.
	s, err := c.ByID(ctx, 150, RouteTargetCacheMaxAge)
	if err != nil || s == nil || s.Name != "s-50" || pages.Load() != 3 {
		t.Fatalf("ByID(150) = %v, %v after %d pages", s, err, pages.Load())
	}
	// Within a minute route targets come from the cache; All's 10 s is over at 11 s.
	now = now.Add(11 * time.Second)
	if _, err := c.ByID(ctx, 101, RouteTargetCacheMaxAge); err != nil || pages.Load() != 3 {
		t.Fatalf("ByID within its max-age refetched: %d pages, %v", pages.Load(), err)
	}
	if all, err := c.All(ctx, 0); err != nil || len(all) != 120 || pages.Load() != 6 {
		t.Fatalf("All after 11 s = %d servers, %v, %d pages; want 120, nil, 6", len(all), err, pages.Load())
	}
	// An unknown server refetches and answers (nil, nil).
	if s, err := c.ByID(ctx, 9999, RouteTargetCacheMaxAge); s != nil || err != nil || pages.Load() != 9 {
		t.Fatalf("ByID(unknown) = %v, %v after %d pages", s, err, pages.Load())
	}
}
