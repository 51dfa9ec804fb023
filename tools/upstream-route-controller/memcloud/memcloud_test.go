package memcloud

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	cloudprovider "k8s.io/cloud-provider"
)

func route(node, cidr string) *cloudprovider.Route {
	return &cloudprovider.Route{
		TargetNode:          types.NodeName(node),
		DestinationCIDR:     cidr,
		TargetNodeAddresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}},
	}
}

func TestCountsAndNames(t *testing.T) {
	ctx := context.Background()
	c := New(Options{})
	if err := c.CreateRoute(ctx, "k", "uid-a", route("a", "10.244.0.0/24")); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateRoute(ctx, "k", "uid-b", route("b", "10.244.1.0/24")); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateRoute(ctx, "other", "uid-c", route("c", "10.244.2.0/24")); err != nil {
		t.Fatal(err)
	}
	got, err := c.ListRoutes(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("ListRoutes(k) returned %d routes, want 2 (other cluster filtered out)", len(got))
	}
	if want := RouteName("k", "uid-a", "10.244.0.0/24"); got[0].Name != want {
		t.Errorf("route name %q, want %q", got[0].Name, want)
	}
	if got[0].EnableNodeAddresses {
		t.Error("EnableNodeAddresses reported without the option")
	}
	if err := c.DeleteRoute(ctx, "k", got[1]); err != nil {
		t.Fatal(err)
	}
	s := c.Snapshot()
	if s.List != 1 || s.Create != 3 || s.Delete != 1 || s.CreateErrors != 0 || s.DeleteErrors != 0 {
		t.Errorf("counters %+v", s)
	}
	if s.Routes != 2 || s.RoutesByNode["a"] != 1 || s.RoutesByNode["b"] != 0 || s.RoutesByNode["c"] != 1 {
		t.Errorf("table %+v", s)
	}
}

func TestListReturnsCopies(t *testing.T) {
	ctx := context.Background()
	c := New(Options{EnableNodeAddresses: true})
	if err := c.CreateRoute(ctx, "k", "h", route("a", "10.244.0.0/24")); err != nil {
		t.Fatal(err)
	}
	first, _ := c.ListRoutes(ctx, "k")
	if !first[0].EnableNodeAddresses {
		t.Error("EnableNodeAddresses not reported with the option set")
	}
	first[0].TargetNode = "mutated"
	first[0].TargetNodeAddresses[0].Address = "198.51.100.9"
	second, _ := c.ListRoutes(ctx, "k")
	if second[0].TargetNode != "a" || second[0].TargetNodeAddresses[0].Address != "192.0.2.1" {
		t.Errorf("caller mutation leaked into the table: %+v", second[0])
	}
}

func TestErrorsAreNotSticky(t *testing.T) {
	ctx := context.Background()
	c := New(Options{})
	if err := c.CreateRoute(ctx, "k", "h", route("a", "10.244.0.0/24")); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateRoute(ctx, "k", "h", route("a", "10.244.0.0/24")); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("duplicate create: %v, want ErrAlreadyExists", err)
	}
	if err := c.CreateRoute(ctx, "k", "h2", route("b", "10.244.0.0/24")); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("second route to one destination: %v, want ErrAlreadyExists", err)
	}
	if err := c.DeleteRoute(ctx, "k", &cloudprovider.Route{Name: "missing"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of a missing route: %v, want ErrNotFound", err)
	}
	if err := c.DeleteRoute(ctx, "k", route("zz", "10.244.9.0/24")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unnamed delete of a missing route: %v, want ErrNotFound", err)
	}
	// The fake in k8s.io/cloud-provider would now fail every call.
	routes, err := c.ListRoutes(ctx, "k")
	if err != nil || len(routes) != 1 {
		t.Fatalf("ListRoutes after errors: %d routes, err %v", len(routes), err)
	}
	if err := c.CreateRoute(ctx, "k", "h3", route("c", "10.244.3.0/24")); err != nil {
		t.Fatalf("create after errors: %v", err)
	}
	if err := c.DeleteRoute(ctx, "k", route("a", "10.244.0.0/24")); err != nil {
		t.Fatalf("unnamed delete by destination and node: %v", err)
	}
	s := c.Snapshot()
	if s.Create != 4 || s.CreateErrors != 2 || s.Delete != 3 || s.DeleteErrors != 2 || s.List != 1 || s.ListErrors != 0 {
		t.Errorf("counters %+v", s)
	}
	if s.Routes != 1 {
		t.Errorf("routes %d, want 1", s.Routes)
	}
}

// With the latency spent outside the lock, n concurrent calls take about one
// latency, not n of them.
func TestLatencyOverlapsAcrossCalls(t *testing.T) {
	const n = 20
	const latency = 100 * time.Millisecond
	ctx := context.Background()
	c := New(Options{Latency: latency})
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cidr := fmt.Sprintf("10.244.%d.0/24", i)
			if err := c.CreateRoute(ctx, "k", "h", route("n", cidr)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if elapsed < latency {
		t.Errorf("calls finished in %v, less than the latency %v", elapsed, latency)
	}
	if elapsed > n*latency/4 {
		t.Errorf("%d concurrent calls took %v: latency is being serialised", n, elapsed)
	}
	if s := c.Snapshot(); s.Routes != n || s.Create != n {
		t.Errorf("snapshot %+v", s)
	}
}

func TestLatencyGivesUpWhenContextEnds(t *testing.T) {
	c := New(Options{Latency: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := c.CreateRoute(ctx, "k", "h", route("a", "10.244.0.0/24"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if s := c.Snapshot(); s.Routes != 0 || s.Create != 1 || s.CreateErrors != 1 || c.InFlight() != 0 {
		t.Errorf("snapshot %+v, in flight %d", s, c.InFlight())
	}
}
