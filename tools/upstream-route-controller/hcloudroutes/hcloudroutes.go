// Package hcloudroutes is a cloudprovider.Routes for Hetzner Cloud networks
// built on the official client github.com/hetznercloud/hcloud-go/v2. It makes
// the requests hcloud-cloud-controller-manager's hcloud/routes.go makes, so
// the upstream route controller can be measured with Hetzner's own request
// pattern against a fake of the API (hcloud-go's WithEndpoint).
//
// Followed: hcloud-cloud-controller-manager hcloud/routes.go and
// internal/cache/{cache,servercache}.go at commit 03dda3393e9d (2026, after
// #1215 removed the recursive retry and #1269 added the shared server cache),
// with the defaults the CCM runs with: server cache mode "all", default
// max-age 10 s, 1 min for route targets, hcloud-go's default retry (conflict,
// rate_limit_exceeded, bad_gateway, timeout: exponential from 1 s, at most 5
// retries) and action polling (GET /actions?id=…, constant 500 ms).
//
// Two things differ and change no request: the ClusterCIDRMisconfigured
// event is a log line only (no event recorder here), and the network the
// last call loaded is kept behind a mutex (the CCM swaps the pointer without
// one while the route controller runs up to 200 calls at once).
package hcloudroutes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"
)

// The CCM's defaults (HCLOUD_SERVER_CACHE_MAX_AGE, routeTargetCacheMaxAge).
const (
	DefaultServerCacheMaxAge = 10 * time.Second
	RouteTargetCacheMaxAge   = time.Minute
)

// Options configure New.
type Options struct {
	// Endpoint is the API base URL ending in /v1 (HCLOUD_ENDPOINT).
	Endpoint string
	// Token is the API token (HCLOUD_TOKEN).
	Token string
	// Network is the network's id or name (HCLOUD_NETWORK).
	Network string
	// ClusterCIDR is the cluster's IPv4 pod range, for the mismatch warning.
	ClusterCIDR string
	// ServerCacheMaxAge is the server cache's default max-age (0: 10 s).
	ServerCacheMaxAge time.Duration
}

type counter struct{ calls, errors atomic.Int64 }

func (c *counter) record(err error) error {
	c.calls.Add(1)
	if err != nil {
		c.errors.Add(1)
	}
	return err
}

// Routes implements cloudprovider.Routes like the hcloud CCM.
type Routes struct {
	client      *hcloud.Client
	serverCache *serverCache
	clusterCIDR *net.IPNet
	nodeLister  corelisters.NodeLister

	mu      sync.Mutex
	network *hcloud.Network

	list, create, del counter
	inFlight          atomic.Int64
}

var _ cloudprovider.Routes = (*Routes)(nil)

// New resolves the network the way the CCM starts: Network.Get by id or name
// (cloud.go), then GetByID once more (newRoutes).
func New(ctx context.Context, o Options, nodeLister corelisters.NodeLister) (*Routes, error) {
	client := hcloud.NewClient(
		hcloud.WithToken(o.Token),
		hcloud.WithEndpoint(o.Endpoint),
		hcloud.WithApplication("hcloud-cloud-controller", "upstream-route-controller"),
	)
	n, _, err := client.Network.Get(ctx, o.Network)
	if err != nil {
		return nil, fmt.Errorf("hcloud/newCloud: %w", err)
	}
	if n == nil {
		return nil, fmt.Errorf("hcloud/newCloud: network %q not found", o.Network)
	}
	network, _, err := client.Network.GetByID(ctx, n.ID)
	if err != nil {
		return nil, fmt.Errorf("hcloud/newRoutes: %w", err)
	}
	if network == nil {
		return nil, fmt.Errorf("network not found: %d", n.ID)
	}
	_, cidr, err := net.ParseCIDR(o.ClusterCIDR)
	if err != nil {
		return nil, err
	}
	maxAge := o.ServerCacheMaxAge
	if maxAge == 0 {
		maxAge = DefaultServerCacheMaxAge
	}
	return &Routes{
		client:      client,
		serverCache: newServerCache(client, maxAge),
		clusterCIDR: cidr,
		nodeLister:  nodeLister,
		network:     network,
	}, nil
}

func (r *Routes) currentNetwork() *hcloud.Network {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.network
}

func (r *Routes) reloadNetwork(ctx context.Context) (*hcloud.Network, error) {
	id := r.currentNetwork().ID
	n, _, err := r.client.Network.GetByID(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("hcloud/reloadNetwork: %w", err)
	}
	if n == nil {
		return nil, fmt.Errorf("network not found: %d", id)
	}
	r.mu.Lock()
	r.network = n
	r.mu.Unlock()
	return n, nil
}

// ListRoutes reloads the network and maps each route's gateway to a server
// through the (10 s) server cache; a gateway no server has is a blackhole.
func (r *Routes) ListRoutes(ctx context.Context, _ string) ([]*cloudprovider.Route, error) {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	routes, err := r.listRoutes(ctx)
	return routes, r.list.record(err)
}

func (r *Routes) listRoutes(ctx context.Context) ([]*cloudprovider.Route, error) {
	network, err := r.reloadNetwork(ctx)
	if err != nil {
		return nil, fmt.Errorf("hcloud/ListRoutes: %w", err)
	}
	servers, err := r.serverCache.All(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("hcloud/ListRoutes: error fetching servers: %w", err)
	}
	byIP := make(map[string]*hcloud.Server)
	for _, s := range servers {
		if pn := s.PrivateNetFor(network); pn != nil {
			byIP[pn.IP.String()] = s
		}
	}
	out := make([]*cloudprovider.Route, 0, len(network.Routes))
	for _, nr := range network.Routes {
		route := &cloudprovider.Route{
			DestinationCIDR: nr.Destination.String(),
			Name:            fmt.Sprintf("%s-%s", nr.Gateway.String(), nr.Destination.String()),
		}
		if s, ok := byIP[nr.Gateway.String()]; ok {
			route.TargetNode = types.NodeName(s.Name)
		} else {
			route.Blackhole = true
		}
		out = append(out, route)
	}
	return out, nil
}

// CreateRoute resolves the Node's server (1 min cache), checks the gateway
// is one of the Node's InternalIPs, then upserts: reload the network, skip
// when the route is there, replace it when its gateway differs, add it.
func (r *Routes) CreateRoute(ctx context.Context, _ string, _ string, route *cloudprovider.Route) error {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	return r.create.record(r.createRoute(ctx, route))
}

func (r *Routes) createRoute(ctx context.Context, route *cloudprovider.Route) error {
	gateway, err := r.resolveRouteTarget(ctx, string(route.TargetNode))
	if err != nil {
		return fmt.Errorf("hcloud/CreateRoute: error resolving route target: %w", err)
	}
	if !slices.ContainsFunc(route.TargetNodeAddresses, func(a corev1.NodeAddress) bool {
		return a.Type == corev1.NodeInternalIP && a.Address == gateway.String()
	}) {
		return fmt.Errorf("hcloud/CreateRoute: IP %s not part of routes target addresses", gateway)
	}
	_, cidr, err := net.ParseCIDR(route.DestinationCIDR)
	if err != nil {
		return fmt.Errorf("hcloud/CreateRoute: %w", err)
	}
	r.warnCIDRMismatch(cidr, string(route.TargetNode))
	if err := r.upsertRoute(ctx, gateway, cidr, string(route.TargetNode)); err != nil {
		return fmt.Errorf("error upserting route %q via %q: %w", cidr, gateway, err)
	}
	return nil
}

// serverID parses "hcloud://<id>"; a Robot server ("hrobot://") is refused.
func serverID(providerID string) (int64, error) {
	if strings.HasPrefix(providerID, "hrobot://") {
		return 0, errors.New("routes are only supported for cloud servers")
	}
	rest, ok := strings.CutPrefix(providerID, "hcloud://")
	if !ok {
		return 0, fmt.Errorf("provider id %q has no hcloud:// prefix", providerID)
	}
	id, err := strconv.ParseInt(rest, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("provider id %q: %w", providerID, err)
	}
	return id, nil
}

func (r *Routes) resolveRouteTarget(ctx context.Context, nodeName string) (net.IP, error) {
	node, err := r.nodeLister.Get(nodeName)
	if err != nil {
		return nil, fmt.Errorf("error fetching node %s by name: %w", nodeName, err)
	}
	var server *hcloud.Server
	if node.Spec.ProviderID != "" {
		id, err := serverID(node.Spec.ProviderID)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", nodeName, err)
		}
		server, err = r.serverCache.ByID(ctx, id, RouteTargetCacheMaxAge)
		if err != nil {
			return nil, fmt.Errorf("error looking up hcloud server by id %d for node %s: %w", id, nodeName, err)
		}
	} else {
		server, err = r.serverCache.ByName(ctx, node.Name, 0)
		if err != nil {
			return nil, fmt.Errorf("error looking up hcloud server by name for node %s: %w", nodeName, err)
		}
	}
	if server == nil {
		return nil, fmt.Errorf("hcloud server for node %s not found", nodeName)
	}
	pn := server.PrivateNetFor(r.currentNetwork())
	if pn == nil {
		return nil, fmt.Errorf("server %s (%d): network not attached to this server", server.Name, server.ID)
	}
	return pn.IP, nil
}

func (r *Routes) upsertRoute(ctx context.Context, gateway net.IP, cidr *net.IPNet, nodeName string) error {
	network, err := r.reloadNetwork(ctx)
	if err != nil {
		return fmt.Errorf("error reloading network: %w", err)
	}
	destination := cidr.String()
	if i := slices.IndexFunc(network.Routes, func(nr hcloud.NetworkRoute) bool {
		return nr.Destination.String() == destination
	}); i >= 0 {
		existing := network.Routes[i]
		if existing.Gateway.Equal(gateway) {
			klog.InfoS("route already exists: skipping creation", "target-node", nodeName, "destination-cidr", destination)
			return nil
		}
		action, _, err := r.client.Network.DeleteRoute(ctx, network, hcloud.NetworkDeleteRouteOpts{Route: existing})
		if err != nil {
			return fmt.Errorf("error deleting route for %q via %q: %w", destination, gateway, err)
		}
		if err := r.client.Action.WaitFor(ctx, action); err != nil {
			return fmt.Errorf("error deleting route for %q via %q: %w", destination, gateway, err)
		}
	}
	action, _, err := r.client.Network.AddRoute(ctx, network, hcloud.NetworkAddRouteOpts{
		Route: hcloud.NetworkRoute{Destination: cidr, Gateway: gateway},
	})
	if err != nil {
		// The CCM hands locked/conflict to the route controller's
		// RetryOnConflict (5 steps from 100 ms), on top of hcloud-go's own
		// conflict retries.
		if hcloud.IsError(err, hcloud.ErrorCodeLocked, hcloud.ErrorCodeConflict) {
			return apierrors.NewConflict(corev1.Resource("nodes"), nodeName, err)
		}
		return fmt.Errorf("error adding route for %q via %q: %w", destination, gateway, err)
	}
	if err := r.client.Action.WaitFor(ctx, action); err != nil {
		return fmt.Errorf("error adding route for %q via %q: %w", destination, gateway, err)
	}
	return nil
}

// DeleteRoute takes the gateway from the network the last call loaded (no
// request) and deletes the route.
func (r *Routes) DeleteRoute(ctx context.Context, _ string, route *cloudprovider.Route) error {
	r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	return r.del.record(r.deleteRoute(ctx, route))
}

func (r *Routes) deleteRoute(ctx context.Context, route *cloudprovider.Route) error {
	network := r.currentNetwork()
	var ip net.IP
	for _, nr := range network.Routes {
		if nr.Destination.String() == route.DestinationCIDR {
			ip = nr.Gateway
			break
		}
	}
	if ip.IsUnspecified() {
		return fmt.Errorf("hcloud/DeleteRoute: route %s not found in cloud network routes", route.Name)
	}
	_, cidr, err := net.ParseCIDR(route.DestinationCIDR)
	if err != nil {
		return fmt.Errorf("hcloud/DeleteRoute: %w", err)
	}
	action, _, err := r.client.Network.DeleteRoute(ctx, network, hcloud.NetworkDeleteRouteOpts{
		Route: hcloud.NetworkRoute{Destination: cidr, Gateway: ip},
	})
	if err != nil {
		return fmt.Errorf("hcloud/DeleteRoute: %w", err)
	}
	if err := r.client.Action.WaitFor(ctx, action); err != nil {
		return fmt.Errorf("hcloud/DeleteRoute: %w", err)
	}
	return nil
}

func (r *Routes) warnCIDRMismatch(cidr *net.IPNet, node string) {
	clusterLen, _ := r.clusterCIDR.Mask.Size()
	destLen, _ := cidr.Mask.Size()
	if !r.clusterCIDR.Contains(cidr.IP) || destLen < clusterLen {
		klog.Warningf("route CIDR %s is not contained within cluster CIDR %s (node %s)", cidr, r.clusterCIDR, node)
	}
}

// InFlight is the number of calls currently running.
func (r *Routes) InFlight() int64 { return r.inFlight.Load() }

// Stats are call counts (failed calls included) and the routes of the
// network as the last call loaded it.
type Stats struct {
	List, ListErrors     int64
	Create, CreateErrors int64
	Delete, DeleteErrors int64
	Routes               int
	RoutesByNode         map[types.NodeName]int
}

// Snapshot reads the counters; it makes no request.
func (r *Routes) Snapshot() Stats {
	network := r.currentNetwork()
	s := Stats{
		List: r.list.calls.Load(), ListErrors: r.list.errors.Load(),
		Create: r.create.calls.Load(), CreateErrors: r.create.errors.Load(),
		Delete: r.del.calls.Load(), DeleteErrors: r.del.errors.Load(),
		Routes:       len(network.Routes),
		RoutesByNode: map[types.NodeName]int{},
	}
	byIP := map[string]string{}
	for _, sv := range r.serverCache.snapshot() {
		if pn := sv.PrivateNetFor(network); pn != nil {
			byIP[pn.IP.String()] = sv.Name
		}
	}
	for _, nr := range network.Routes {
		if name, ok := byIP[nr.Gateway.String()]; ok {
			s.RoutesByNode[types.NodeName(name)]++
		}
	}
	return s
}
