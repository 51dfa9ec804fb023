// Package memcloud is the in-memory cloud route table that the upstream
// baseline runs against. It implements cloudprovider.Routes and nothing else.
//
// It replaces k8s.io/cloud-provider/fake on purpose: that fake keeps its last
// error forever (one duplicate create makes every later ListRoutes fail), it
// sleeps while holding the lock that serialises all route calls, and it records
// every call in a slice that cannot be read safely while the controller runs.
// Here errors belong to the one call that caused them, the latency is spent
// before the lock is taken so concurrent calls overlap like real cloud
// requests, and every call is counted with atomics that can be read at any time.
package memcloud

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	cloudprovider "k8s.io/cloud-provider"
)

// ErrAlreadyExists is returned by CreateRoute when a route with the same name
// or the same destination already exists in the cluster's table, as a real
// route table rejects a second route for one destination.
var ErrAlreadyExists = errors.New("route already exists")

// ErrNotFound is returned by DeleteRoute when the route is not in the table.
var ErrNotFound = errors.New("route not found")

// Options configures a Cloud.
type Options struct {
	// Latency is spent at the start of every call, outside the table lock.
	Latency time.Duration
	// EnableNodeAddresses is reported on every listed route, so the controller
	// compares node addresses and replaces routes whose addresses changed.
	EnableNodeAddresses bool
}

type storedRoute struct {
	clusterName string
	route       cloudprovider.Route
}

// counter counts the calls of one method and how many of them failed.
type counter struct {
	calls  atomic.Int64
	errors atomic.Int64
}

func (c *counter) record(err error) error {
	c.calls.Add(1)
	if err != nil {
		c.errors.Add(1)
	}
	return err
}

// Cloud is a map-backed route table. The zero value is not usable; call New.
type Cloud struct {
	opts Options

	mu     sync.Mutex
	routes map[string]*storedRoute // by route name

	list, create, del counter
	inFlight          atomic.Int64
}

var _ cloudprovider.Routes = (*Cloud)(nil)

// New returns an empty route table.
func New(opts Options) *Cloud {
	return &Cloud{opts: opts, routes: map[string]*storedRoute{}}
}

// RouteName is the name a created route gets: <cluster>-<hint>-<cidr>.
func RouteName(clusterName, nameHint, cidr string) string {
	return fmt.Sprintf("%s-%s-%s", clusterName, nameHint, cidr)
}

// wait spends the configured latency, giving up early when ctx ends so a
// shutdown is not held up by simulated requests.
func (c *Cloud) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.opts.Latency <= 0 {
		return nil
	}
	t := time.NewTimer(c.opts.Latency)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ListRoutes returns copies of the cluster's routes, sorted by name so that
// runs are reproducible.
func (c *Cloud) ListRoutes(ctx context.Context, clusterName string) ([]*cloudprovider.Route, error) {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	if err := c.wait(ctx); err != nil {
		return nil, c.list.record(err)
	}
	c.mu.Lock()
	out := make([]*cloudprovider.Route, 0, len(c.routes))
	for _, s := range c.routes {
		if s.clusterName != clusterName {
			continue
		}
		r := s.route
		r.TargetNodeAddresses = append([]v1.NodeAddress(nil), s.route.TargetNodeAddresses...)
		r.EnableNodeAddresses = c.opts.EnableNodeAddresses
		out = append(out, &r)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, c.list.record(nil)
}

// CreateRoute stores a copy of route under RouteName(clusterName, nameHint, cidr).
func (c *Cloud) CreateRoute(ctx context.Context, clusterName string, nameHint string, route *cloudprovider.Route) error {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	if err := c.wait(ctx); err != nil {
		return c.create.record(err)
	}
	if route == nil {
		return c.create.record(errors.New("nil route"))
	}
	name := RouteName(clusterName, nameHint, route.DestinationCIDR)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.routes[name]; ok {
		return c.create.record(fmt.Errorf("%w: %s", ErrAlreadyExists, name))
	}
	for _, s := range c.routes {
		if s.clusterName == clusterName && s.route.DestinationCIDR == route.DestinationCIDR {
			return c.create.record(fmt.Errorf("%w: destination %s is routed by %s", ErrAlreadyExists, route.DestinationCIDR, s.route.Name))
		}
	}
	stored := *route
	stored.Name = name
	stored.EnableNodeAddresses = false
	stored.TargetNodeAddresses = append([]v1.NodeAddress(nil), route.TargetNodeAddresses...)
	c.routes[name] = &storedRoute{clusterName: clusterName, route: stored}
	return c.create.record(nil)
}

// DeleteRoute removes the route by name; a route without a name (not one that
// ListRoutes returned) is matched by destination and target node instead.
func (c *Cloud) DeleteRoute(ctx context.Context, clusterName string, route *cloudprovider.Route) error {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	if err := c.wait(ctx); err != nil {
		return c.del.record(err)
	}
	if route == nil {
		return c.del.record(errors.New("nil route"))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if route.Name != "" {
		if s, ok := c.routes[route.Name]; ok && s.clusterName == clusterName {
			delete(c.routes, route.Name)
			return c.del.record(nil)
		}
		return c.del.record(fmt.Errorf("%w: %s", ErrNotFound, route.Name))
	}
	for name, s := range c.routes {
		if s.clusterName == clusterName && s.route.DestinationCIDR == route.DestinationCIDR && s.route.TargetNode == route.TargetNode {
			delete(c.routes, name)
			return c.del.record(nil)
		}
	}
	return c.del.record(fmt.Errorf("%w: %s via %s", ErrNotFound, route.DestinationCIDR, route.TargetNode))
}

// Seed inserts a route directly, bypassing counters and latency, to model
// routes created behind the controller's back.
func (c *Cloud) Seed(clusterName string, route cloudprovider.Route) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.routes[route.Name] = &storedRoute{clusterName: clusterName, route: route}
}

// InFlight is the number of calls currently running.
func (c *Cloud) InFlight() int64 { return c.inFlight.Load() }

// Stats is a snapshot of the counters and the table.
type Stats struct {
	List         int64
	ListErrors   int64
	Create       int64
	CreateErrors int64
	Delete       int64
	DeleteErrors int64
	Routes       int
	RoutesByNode map[types.NodeName]int
}

// Snapshot reads the counters and the table. Counters are read without the
// lock, so a snapshot taken while calls run may be off by the calls in flight.
func (c *Cloud) Snapshot() Stats {
	s := Stats{
		List:         c.list.calls.Load(),
		ListErrors:   c.list.errors.Load(),
		Create:       c.create.calls.Load(),
		CreateErrors: c.create.errors.Load(),
		Delete:       c.del.calls.Load(),
		DeleteErrors: c.del.errors.Load(),
		RoutesByNode: map[types.NodeName]int{},
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s.Routes = len(c.routes)
	for _, r := range c.routes {
		s.RoutesByNode[r.route.TargetNode]++
	}
	return s
}
