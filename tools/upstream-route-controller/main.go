// Command upstream-route-controller runs the unmodified route controller of
// k8s.io/cloud-provider against a real API server and an in-memory cloud
// (package memcloud), wired the way the cloud-controller-manager wires it, so
// that this project's controller can be measured beside it on the same work.
//
// The controller code, its feature gate, queue, rate limits and metrics all
// come from the upstream modules; this file owns only the process: flags,
// clients, informers, the metrics endpoint and the stats written at exit.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	cloudprovider "k8s.io/cloud-provider"
	routecontroller "k8s.io/cloud-provider/controllers/route"
	"k8s.io/component-base/metrics/legacyregistry"
	controllersmetrics "k8s.io/component-base/metrics/prometheus/controllers"
	"k8s.io/klog/v2"
	netutils "k8s.io/utils/net"

	"github.com/cloud-route-controller/cloud-route-controller/tools/upstream-route-controller/awscloud"
	"github.com/cloud-route-controller/cloud-route-controller/tools/upstream-route-controller/hcloudroutes"
	"github.com/cloud-route-controller/cloud-route-controller/tools/upstream-route-controller/memcloud"

	// Registers the controller-manager feature gates (the watch-based routes
	// gate among them) into utilfeature.DefaultMutableFeatureGate.
	_ "k8s.io/controller-manager/pkg/features/register"
	// Client-go request and workqueue metrics, as the controller manager
	// exposes them, so API writes and the "Routes" queue are visible.
	_ "k8s.io/component-base/metrics/prometheus/restclient"
	_ "k8s.io/component-base/metrics/prometheus/workqueue"
)

const watchGate = "CloudControllerManagerWatchBasedRoutesReconciliation"

type options struct {
	kubeconfig          string
	watchBased          bool
	clusterName         string
	clusterCIDR         string
	reconcilePeriod     time.Duration
	minResyncPeriod     time.Duration
	qps                 float64
	burst               int
	cloudLatency        time.Duration
	enableNodeAddresses bool
	metricsAddr         string
	statsOut            string
	cloud               string
	hcloudEndpoint      string
	hcloudNetwork       string
	cloudConfig         string
}

func parseFlags(fs *flag.FlagSet, args []string) (*options, error) {
	o := &options{}
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "path to the kubeconfig (default $KUBECONFIG)")
	fs.BoolVar(&o.watchBased, "watch-based", false, "enable the "+watchGate+" feature gate (KEP-5237 watch mode)")
	fs.StringVar(&o.clusterName, "cluster-name", "kubernetes", "cluster name, the route-table namespace")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", "10.244.0.0/16", "pod CIDRs of the cluster, comma separated (at most one per IP family)")
	fs.DurationVar(&o.reconcilePeriod, "route-reconciliation-period", 10*time.Second, "period of the legacy reconcile loop")
	fs.DurationVar(&o.minResyncPeriod, "min-resync-period", 12*time.Hour, "informer resync is this times a random factor in [1,2); 0 disables")
	fs.Float64Var(&o.qps, "kube-api-qps", 20, "client QPS towards the API server")
	fs.IntVar(&o.burst, "kube-api-burst", 30, "client burst towards the API server")
	fs.DurationVar(&o.cloudLatency, "cloud-latency", 0, "latency added to every cloud call")
	fs.BoolVar(&o.enableNodeAddresses, "enable-node-addresses", false, "report EnableNodeAddresses=true on listed routes")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:0", "address serving /metrics; empty disables")
	fs.StringVar(&o.statsOut, "stats-out", "", "file to write the JSON stats to at exit")
	fs.StringVar(&o.cloud, "cloud", "memory", "cloud behind the routes: memory (in-process, counted), aws (k8s.io/cloud-provider-aws, needs --cloud-config) or hcloud (hcloud-go against --hcloud-endpoint, token from $HCLOUD_TOKEN)")
	fs.StringVar(&o.hcloudEndpoint, "hcloud-endpoint", "https://api.hetzner.cloud/v1", "hcloud: API base URL (HCLOUD_ENDPOINT)")
	fs.StringVar(&o.hcloudNetwork, "hcloud-network", "", "hcloud: network id or name (HCLOUD_NETWORK)")
	fs.StringVar(&o.cloudConfig, "cloud-config", "", "the provider's cloud config file (aws: gcfg INI with [Global] and [ServiceOverride])")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.reconcilePeriod <= 0 {
		return nil, errors.New("--route-reconciliation-period must be positive")
	}
	if o.minResyncPeriod < 0 {
		return nil, errors.New("--min-resync-period must not be negative")
	}
	switch o.cloud {
	case "memory":
	case "aws":
		if o.cloudConfig == "" {
			return nil, errors.New("--cloud aws needs --cloud-config")
		}
	case "hcloud":
		if o.hcloudNetwork == "" {
			return nil, errors.New("--cloud=hcloud needs --hcloud-network")
		}
	default:
		return nil, fmt.Errorf("--cloud %q: want memory, aws or hcloud", o.cloud)
	}
	return o, nil
}

// processCIDRs applies the rules of the cloud-controller-manager's route
// controller start-up: a comma list, at most two, and two only when they are
// one IPv4 and one IPv6.
func processCIDRs(list string) ([]*net.IPNet, error) {
	cidrs, err := netutils.ParseCIDRs(strings.Split(strings.TrimSpace(list), ","))
	if err != nil {
		return nil, err
	}
	if len(cidrs) > 1 {
		dual, _ := netutils.IsDualStackCIDRs(cidrs)
		if !dual {
			return nil, fmt.Errorf("len of ClusterCIDRs==%d and they are not configured as dual stack (at least one from each IPFamily)", len(cidrs))
		}
	}
	if len(cidrs) > 2 {
		return nil, fmt.Errorf("length of clusterCIDRs is:%d more than max allowed of 2", len(cidrs))
	}
	return cidrs, nil
}

// resyncPeriod mirrors the controller manager's ResyncPeriod: drawn once per
// process from [min, 2*min).
func resyncPeriod(min time.Duration) time.Duration {
	if min == 0 {
		return 0
	}
	return time.Duration(float64(min.Nanoseconds()) * (1 + rand.Float64()))
}

func newClient(base *rest.Config, o *options, userAgent string) (*kubernetes.Clientset, error) {
	cfg := rest.CopyConfig(base)
	cfg.QPS = float32(o.qps)
	cfg.Burst = o.burst
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	return kubernetes.NewForConfig(rest.AddUserAgent(cfg, userAgent))
}

// Stats is the JSON written at exit. Counts are calls, errors included.
type Stats struct {
	Mode             string         `json:"mode"`
	Cloud            string         `json:"cloud"`
	List             int64          `json:"list"`
	ListErrors       int64          `json:"list_errors"`
	Create           int64          `json:"create"`
	CreateErrors     int64          `json:"create_errors"`
	Delete           int64          `json:"delete"`
	DeleteErrors     int64          `json:"delete_errors"`
	Routes           int            `json:"routes"`
	RoutesByNode     map[string]int `json:"routes_by_node"`
	RouteSyncs       float64        `json:"route_syncs"`
	WallSeconds      float64        `json:"wall_seconds"`
	CPUUserSeconds   float64        `json:"cpu_user_seconds"`
	CPUSystemSeconds float64        `json:"cpu_system_seconds"`
	MaxRSSKiB        int64          `json:"max_rss_kib"`
}

// routeSyncs sums route_controller_route_sync_total over all label values.
func routeSyncs() float64 {
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		klog.ErrorS(err, "gathering metrics")
	}
	var total float64
	for _, f := range families {
		if f.GetName() != "route_controller_route_sync_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// countedRoutes is a Routes that counts its calls.
type countedRoutes interface {
	cloudprovider.Routes
	InFlight() int64
}

// hcloudCounted adapts hcloudroutes' counters to the memory cloud's.
type hcloudCounted struct{ *hcloudroutes.Routes }

func (h hcloudCounted) Snapshot() memcloud.Stats {
	s := h.Routes.Snapshot()
	return memcloud.Stats{List: s.List, ListErrors: s.ListErrors, Create: s.Create, CreateErrors: s.CreateErrors,
		Delete: s.Delete, DeleteErrors: s.DeleteErrors, Routes: s.Routes, RoutesByNode: s.RoutesByNode}
}

// awsCounted adapts awscloud's counters to the memory cloud's. The table is
// in the cloud, read by whoever runs this.
type awsCounted struct{ *awscloud.Cloud }

func (c awsCounted) Snapshot() memcloud.Stats {
	a := c.Cloud.Snapshot()
	return memcloud.Stats{
		List: a.List, ListErrors: a.ListErrors,
		Create: a.Create, CreateErrors: a.CreateErrors,
		Delete: a.Delete, DeleteErrors: a.DeleteErrors,
		RoutesByNode: map[types.NodeName]int{},
	}
}

func collectStats(o *options, snap memcloud.Stats, started time.Time) Stats {
	s := Stats{
		Mode:         "periodic",
		Cloud:        o.cloud,
		List:         snap.List,
		ListErrors:   snap.ListErrors,
		Create:       snap.Create,
		CreateErrors: snap.CreateErrors,
		Delete:       snap.Delete,
		DeleteErrors: snap.DeleteErrors,
		Routes:       snap.Routes,
		RoutesByNode: map[string]int{},
		RouteSyncs:   routeSyncs(),
		WallSeconds:  time.Since(started).Seconds(),
	}
	if o.watchBased {
		s.Mode = "watch"
	}
	for n, c := range snap.RoutesByNode {
		s.RoutesByNode[string(n)] = c
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.CPUUserSeconds = time.Duration(ru.Utime.Nano()).Seconds()
		s.CPUSystemSeconds = time.Duration(ru.Stime.Nano()).Seconds()
		s.MaxRSSKiB = ru.Maxrss // KiB on Linux
	}
	return s
}

func serveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	klog.InfoS("Serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	mux := http.NewServeMux()
	mux.Handle("/metrics", legacyregistry.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "metrics server stopped")
		}
	}()
	return nil
}

func run(o *options) error {
	started := time.Now()
	if o.watchBased {
		if err := utilfeature.DefaultMutableFeatureGate.Set(watchGate + "=true"); err != nil {
			return fmt.Errorf("setting feature gate: %w", err)
		}
	}
	cidrs, err := processCIDRs(o.clusterCIDR)
	if err != nil {
		return fmt.Errorf("--cluster-cidr: %w", err)
	}
	base, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	// Like the controller manager: one client for the shared informers, one
	// for the controller, each with its own rate limiter.
	informerClient, err := newClient(base, o, "shared-informers")
	if err != nil {
		return err
	}
	controllerClient, err := newClient(base, o, "route-controller")
	if err != nil {
		return err
	}

	resync := resyncPeriod(o.minResyncPeriod)
	factory := informers.NewSharedInformerFactory(informerClient, resync)
	var cloud countedRoutes
	var snapshot func() memcloud.Stats
	switch o.cloud {
	case "hcloud":
		h, err := hcloudroutes.New(context.Background(), hcloudroutes.Options{
			Endpoint:    o.hcloudEndpoint,
			Token:       os.Getenv("HCLOUD_TOKEN"),
			Network:     o.hcloudNetwork,
			ClusterCIDR: cidrs[0].String(),
		}, factory.Core().V1().Nodes().Lister())
		if err != nil {
			return fmt.Errorf("hcloud routes: %w", err)
		}
		cloud, snapshot = h, hcloudCounted{h}.Snapshot
	case "aws":
		// As the cloud-controller-manager does: the provider's node cache
		// is fed by the same informer factory (SetInformers).
		c, err := awscloud.New(o.cloudConfig, factory)
		if err != nil {
			return err
		}
		cloud, snapshot = c, awsCounted{c}.Snapshot
	default:
		m := memcloud.New(memcloud.Options{Latency: o.cloudLatency, EnableNodeAddresses: o.enableNodeAddresses})
		cloud, snapshot = m, m.Snapshot
	}
	rc, err := routecontroller.New(cloud, controllerClient, factory.Core().V1().Nodes(), o.clusterName, cidrs)
	if err != nil {
		return fmt.Errorf("creating route controller: %w", err)
	}

	controllersmetrics.Register()
	if o.metricsAddr != "" {
		if err := serveMetrics(o.metricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	klog.InfoS("Starting upstream route controller", "watchBased", o.watchBased,
		"gate", utilfeature.DefaultFeatureGate.Enabled(watchGate), "resync", resync,
		"period", o.reconcilePeriod, "cloud", o.cloud, "cloudLatency", o.cloudLatency, "clusterCIDRs", cidrs)

	done := make(chan struct{})
	go func() {
		defer close(done)
		rc.Run(ctx, o.reconcilePeriod, controllersmetrics.NewControllerManagerMetrics("cloud-controller-manager"))
	}()
	factory.Start(ctx.Done())

	<-ctx.Done()
	stop()
	klog.InfoS("Stopping")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		klog.InfoS("route controller did not stop within 10s; writing stats anyway")
	}
	factory.Shutdown()
	// Calls cut short by the cancelled context return at once; give them a
	// moment so the counters are final.
	for deadline := time.Now().Add(5 * time.Second); cloud.InFlight() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}

	out, err := json.MarshalIndent(collectStats(o, snapshot(), started), "", "  ")
	if err != nil {
		return err
	}
	out = append(out, '\n')
	if o.statsOut != "" {
		if err := os.WriteFile(o.statsOut, out, 0o644); err != nil {
			return fmt.Errorf("writing stats: %w", err)
		}
	}
	_, err = os.Stdout.Write(out)
	return err
}

func main() {
	klog.InitFlags(flag.CommandLine)
	o, err := parseFlags(flag.CommandLine, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		klog.ErrorS(err, "upstream-route-controller failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
