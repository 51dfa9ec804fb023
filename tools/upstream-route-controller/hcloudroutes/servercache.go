package hcloudroutes

import (
	"context"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// serverCache is the CCM's shared server cache in its default mode "all":
// a miss or a stale entry refetches every server (GET /servers, 50 a page).
// Its quirks are kept because they decide the request count:
//   - All() takes the age of the oldest entry, starting from the zero time,
//     so an empty cache is refetched (the CCM's internal/cache since
//     hcloud-cloud-controller-manager #1269, 2026-06-18; before it an empty
//     cache counted as fresh and the first list after a start mapped no
//     gateway to a server);
//   - a lookup that misses after the refresh answers (nil, nil).
type serverCache struct {
	client        *hcloud.Client
	defaultMaxAge time.Duration
	now           func() time.Time

	mu     sync.Mutex
	byID   map[int64]cacheEntry
	byName map[string]cacheEntry
}

type cacheEntry struct {
	refreshedAt time.Time
	value       *hcloud.Server
}

func newServerCache(client *hcloud.Client, defaultMaxAge time.Duration) *serverCache {
	return &serverCache{
		client:        client,
		defaultMaxAge: defaultMaxAge,
		now:           time.Now,
		byID:          map[int64]cacheEntry{},
		byName:        map[string]cacheEntry{},
	}
}

func (c *serverCache) maxAge(override time.Duration) time.Duration {
	if override > 0 {
		return override
	}
	return c.defaultMaxAge
}

// All answers every cached server, refetching them all when the oldest entry
// is older than maxAge (0: the default).
func (c *serverCache) All(ctx context.Context, maxAge time.Duration) ([]*hcloud.Server, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	var oldest time.Time
	for _, e := range c.byID {
		if oldest.IsZero() || e.refreshedAt.Before(oldest) {
			oldest = e.refreshedAt
		}
	}
	if now.Sub(oldest) > c.maxAge(maxAge) {
		if err := c.refreshAll(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]*hcloud.Server, 0, len(c.byID))
	for _, e := range c.byID {
		out = append(out, e.value)
	}
	return out, nil
}

// ByID answers the server with id from the cache when its entry is younger
// than maxAge, else after refetching all servers.
func (c *serverCache) ByID(ctx context.Context, id int64, maxAge time.Duration) (*hcloud.Server, error) {
	return c.lookup(ctx, maxAge, func() (cacheEntry, bool) { e, ok := c.byID[id]; return e, ok })
}

// ByName is ByID by server name.
func (c *serverCache) ByName(ctx context.Context, name string, maxAge time.Duration) (*hcloud.Server, error) {
	return c.lookup(ctx, maxAge, func() (cacheEntry, bool) { e, ok := c.byName[name]; return e, ok })
}

func (c *serverCache) lookup(ctx context.Context, maxAge time.Duration, find func() (cacheEntry, bool)) (*hcloud.Server, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := find(); ok && c.now().Sub(e.refreshedAt) <= c.maxAge(maxAge) {
		return e.value, nil
	}
	if err := c.refreshAll(ctx); err != nil {
		return nil, err
	}
	if e, ok := find(); ok {
		return e.value, nil
	}
	return nil, nil
}

// refreshAll replaces the cache with every server; called with mu held, so
// concurrent misses wait for one refresh instead of each making their own.
func (c *serverCache) refreshAll(ctx context.Context) error {
	servers, err := c.client.Server.All(ctx)
	if err != nil {
		return err
	}
	at := c.now()
	c.byID = make(map[int64]cacheEntry, len(servers))
	c.byName = make(map[string]cacheEntry, len(servers))
	for _, s := range servers {
		e := cacheEntry{refreshedAt: at, value: s}
		c.byID[s.ID] = e
		c.byName[s.Name] = e
	}
	return nil
}

func (c *serverCache) snapshot() []*hcloud.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*hcloud.Server, 0, len(c.byID))
	for _, e := range c.byID {
		out = append(out, e.value)
	}
	return out
}
