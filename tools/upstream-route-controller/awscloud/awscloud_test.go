package awscloud

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

func TestConfigNeedsEveryField(t *testing.T) {
	o := Options{Endpoint: "http://127.0.0.1:1", Zone: "us-east-1a", VPC: "vpc-1", SubnetID: "subnet-1", RouteTableID: "rtb-1", ClusterTag: "c"}
	if _, err := Config(o); err != nil {
		t.Fatalf("complete options: %v", err)
	}
	bad := o
	bad.RouteTableID = ""
	if _, err := Config(bad); err == nil {
		t.Error("missing RouteTableID accepted")
	}
	bad = o
	bad.Zone = "us-east-1"
	if _, err := Config(bad); err == nil {
		t.Error("a region accepted as zone")
	}
	bad = o
	bad.ClusterTag = "a\"b"
	if _, err := Config(bad); err == nil {
		t.Error("a quote accepted")
	}
}

// A fake EC2 that records each request's action and answers
// DescribeRouteTables with one table holding one route to an instance
// whose Node does not exist, and DescribeInstances with that instance.
type fakeEC2 struct {
	mu      sync.Mutex
	actions []string
	bodies  []string
}

const describeRouteTables = `<?xml version="1.0" encoding="UTF-8"?>
<DescribeRouteTablesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId><routeTableSet><item><routeTableId>rtb-1</routeTableId><vpcId>vpc-1</vpcId><routeSet><item><destinationCidrBlock>10.0.0.0/16</destinationCidrBlock><gatewayId>local</gatewayId><state>active</state><origin>CreateRouteTable</origin></item><item><destinationCidrBlock>10.244.1.0/24</destinationCidrBlock><instanceId>i-1</instanceId><state>active</state><origin>CreateRoute</origin></item></routeSet><associationSet/><tagSet/></item></routeTableSet></DescribeRouteTablesResponse>`

const describeInstances = `<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r</requestId><reservationSet><item><reservationId>r-1</reservationId><instancesSet><item><instanceId>i-1</instanceId><instanceState><code>16</code><name>running</name></instanceState><placement><availabilityZone>us-east-1a</availabilityZone></placement></item></instancesSet></item></reservationSet></DescribeInstancesResponse>`

func (f *fakeEC2) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	form, _ := url.ParseQuery(string(b))
	f.mu.Lock()
	f.actions = append(f.actions, form.Get("Action"))
	f.bodies = append(f.bodies, string(b))
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml")
	switch form.Get("Action") {
	case "DescribeRouteTables":
		_, _ = io.WriteString(w, describeRouteTables)
	case "DescribeInstances":
		_, _ = io.WriteString(w, describeInstances)
	default:
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `<Response><Errors><Error><Code>InvalidAction</Code><Message>no</Message></Error></Errors></Response>`)
	}
}

// The provider built from Config asks nothing of the metadata service and
// sends EC2 requests only to the override, naming the configured table;
// and, as upstream does, its ListRoutes fails as a whole when one routed
// instance has no Node.
func TestProviderUsesTheOverrideAndNoMetadata(t *testing.T) {
	ec2 := &fakeEC2{}
	srv := httptest.NewServer(ec2)
	defer srv.Close()
	var imdsHits int
	var imdsMu sync.Mutex
	imds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		imdsMu.Lock()
		imdsHits++
		imdsMu.Unlock()
		w.WriteHeader(http.StatusNotFound)
	}))
	defer imds.Close()
	t.Setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.URL)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_ACCESS_KEY_ID", "testing")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "testing")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))

	text, err := Config(Options{Endpoint: srv.URL, Zone: "us-east-1a", VPC: "vpc-1", SubnetID: "subnet-1", RouteTableID: "rtb-1", ClusterTag: "kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cloud.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	cloud, err := New(path, factory)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	_, err = cloud.ListRoutes(ctx, "kubernetes")
	if err == nil || !strings.Contains(err.Error(), `node with instanceID "i-1" not found`) {
		t.Fatalf("ListRoutes error = %v; want upstream's node-not-found failure", err)
	}
	if s := cloud.Snapshot(); s.List != 1 || s.ListErrors != 1 {
		t.Errorf("counters = %+v; want one failed list", s)
	}
	ec2.mu.Lock()
	defer ec2.mu.Unlock()
	if len(ec2.actions) == 0 || ec2.actions[0] != "DescribeRouteTables" {
		t.Fatalf("EC2 actions = %v; want DescribeRouteTables first", ec2.actions)
	}
	if !strings.Contains(ec2.bodies[0], "rtb-1") {
		t.Errorf("DescribeRouteTables body %q does not name the configured table", ec2.bodies[0])
	}
	imdsMu.Lock()
	defer imdsMu.Unlock()
	if imdsHits != 0 {
		t.Errorf("metadata service asked %d times", imdsHits)
	}
}
