// Package awscloud builds the real AWS cloud provider of
// k8s.io/cloud-provider-aws (pkg/providers/v1) for the upstream route
// controller, pointed at an EC2 endpoint of the caller's choosing (moto, or
// the project's proxy in front of it) through the provider's own cloud
// config, and counts the route calls the controller makes on it.
//
// Nothing of the provider is replaced: the controller gets the provider's
// Routes() as the cloud-controller-manager would, with the provider's
// informer-fed node cache set up from the same informer factory. Only the
// process environment is chosen so that the provider needs no instance
// metadata: the cloud config names the zone (hence the region), the VPC, a
// subnet, the cluster tag and the route table, which makes the provider
// build its "master on a different account" placeholder instead of asking
// IMDS who it runs as. Requests to EC2 are counted by whatever serves the
// endpoint; the counters here are per route call, as memcloud's are.
package awscloud

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"k8s.io/client-go/informers"
	cloudprovider "k8s.io/cloud-provider"

	// Registers the "aws" provider with k8s.io/cloud-provider.
	_ "k8s.io/cloud-provider-aws/pkg/providers/v1"
)

// ProviderName is the name the provider registers under.
const ProviderName = "aws"

// Options describe the emulated account the provider talks to.
type Options struct {
	// EC2 endpoint URL, e.g. http://127.0.0.1:5000.
	Endpoint string
	// Availability zone, e.g. us-east-1a; the provider derives the region
	// from it.
	Zone string
	// VPC and SubnetID of the cluster; with ClusterTag they make the
	// provider skip its metadata lookups.
	VPC      string
	SubnetID string
	// RouteTableID is the one table the provider manages.
	RouteTableID string
	// ClusterTag is the legacy cluster id (KubernetesClusterTag).
	ClusterTag string
}

// Config renders the provider's cloud config (gcfg INI) for o: the
// [Global] keys that avoid the metadata service and one [ServiceOverride]
// sending EC2 to o.Endpoint.
func Config(o Options) (string, error) {
	region, err := regionOf(o.Zone)
	if err != nil {
		return "", err
	}
	for name, v := range map[string]string{"Endpoint": o.Endpoint, "VPC": o.VPC, "SubnetID": o.SubnetID, "RouteTableID": o.RouteTableID, "ClusterTag": o.ClusterTag} {
		if v == "" {
			return "", fmt.Errorf("awscloud: %s is required", name)
		}
		if strings.ContainsAny(v, "\"\n\\") {
			return "", fmt.Errorf("awscloud: %s %q contains a quote, backslash or newline", name, v)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[Global]\n")
	fmt.Fprintf(&b, "Zone = %s\n", o.Zone)
	fmt.Fprintf(&b, "Region = %s\n", region)
	fmt.Fprintf(&b, "VPC = %s\n", o.VPC)
	fmt.Fprintf(&b, "SubnetID = %s\n", o.SubnetID)
	fmt.Fprintf(&b, "RouteTableID = %s\n", o.RouteTableID)
	fmt.Fprintf(&b, "KubernetesClusterTag = %s\n", o.ClusterTag)
	fmt.Fprintf(&b, "\n[ServiceOverride \"ec2\"]\n")
	// The provider matches the override against the SDK's service id,
	// "EC2"; any other spelling is ignored silently.
	fmt.Fprintf(&b, "Service = EC2\n")
	fmt.Fprintf(&b, "Region = %s\n", region)
	fmt.Fprintf(&b, "URL = %s\n", o.Endpoint)
	fmt.Fprintf(&b, "SigningRegion = %s\n", region)
	return b.String(), nil
}

// regionOf is the provider's own rule (azToRegion): the zone without its
// trailing letter.
func regionOf(zone string) (string, error) {
	if len(zone) < 2 || zone[len(zone)-1] < 'a' || zone[len(zone)-1] > 'z' {
		return "", fmt.Errorf("awscloud: zone %q is not like us-east-1a", zone)
	}
	return zone[:len(zone)-1], nil
}

// New builds the provider from the cloud config file at configPath (as the
// cloud-controller-manager's --cloud-config), hands it the informer factory
// (SetInformers, before the factory starts) and returns its Routes wrapped
// in call counters.
//
// Credentials come from the standard AWS chain, normally the
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment of the process.
// Whatever the config, the provider asks the metadata service for its
// identity document while it is built (and only logs the answer); the
// process needs AWS_EC2_METADATA_DISABLED=true so that no request leaves.
// With a config from Config nothing else needs metadata.
func New(configPath string, factory informers.SharedInformerFactory) (*Cloud, error) {
	f, err := os.Open(configPath)
	if err != nil {
		return nil, fmt.Errorf("awscloud: %w", err)
	}
	defer f.Close()
	iface, err := cloudprovider.GetCloudProvider(ProviderName, f)
	if err != nil {
		return nil, fmt.Errorf("awscloud: building the provider: %w", err)
	}
	if iu, ok := iface.(cloudprovider.InformerUser); ok {
		iu.SetInformers(factory)
	}
	routes, ok := iface.Routes()
	if !ok {
		return nil, fmt.Errorf("awscloud: the provider offers no Routes")
	}
	return &Cloud{inner: routes}, nil
}

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

// Cloud is the provider's Routes with per-call counters.
type Cloud struct {
	inner             cloudprovider.Routes
	list, create, del counter
	inFlight          atomic.Int64
}

// NewCounting wraps any Routes in the counters (for tests).
func NewCounting(r cloudprovider.Routes) *Cloud { return &Cloud{inner: r} }

// ListRoutes implements cloudprovider.Routes.
func (c *Cloud) ListRoutes(ctx context.Context, clusterName string) ([]*cloudprovider.Route, error) {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	r, err := c.inner.ListRoutes(ctx, clusterName)
	return r, c.list.record(err)
}

// CreateRoute implements cloudprovider.Routes.
func (c *Cloud) CreateRoute(ctx context.Context, clusterName string, nameHint string, route *cloudprovider.Route) error {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	return c.create.record(c.inner.CreateRoute(ctx, clusterName, nameHint, route))
}

// DeleteRoute implements cloudprovider.Routes.
func (c *Cloud) DeleteRoute(ctx context.Context, clusterName string, route *cloudprovider.Route) error {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	return c.del.record(c.inner.DeleteRoute(ctx, clusterName, route))
}

// InFlight is the number of route calls currently running.
func (c *Cloud) InFlight() int64 { return c.inFlight.Load() }

// Stats are the call counters.
type Stats struct {
	List, ListErrors, Create, CreateErrors, Delete, DeleteErrors int64
}

// Snapshot reads the counters.
func (c *Cloud) Snapshot() Stats {
	return Stats{
		List: c.list.calls.Load(), ListErrors: c.list.errors.Load(),
		Create: c.create.calls.Load(), CreateErrors: c.create.errors.Load(),
		Delete: c.del.calls.Load(), DeleteErrors: c.del.errors.Load(),
	}
}

var _ cloudprovider.Routes = (*Cloud)(nil)
