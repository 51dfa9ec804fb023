package main

import (
	"flag"
	"testing"
	"time"
)

func TestProcessCIDRs(t *testing.T) {
	cases := []struct {
		in   string
		want int
		ok   bool
	}{
		{"10.244.0.0/16", 1, true},
		{" 10.244.0.0/16,fd00:10:244::/56 ", 2, true},
		{"10.244.0.0/16,10.245.0.0/16", 0, false}, // two of one family
		{"10.244.0.0/16,fd00::/56,10.245.0.0/16", 0, false},
		{"", 0, false},
		{"not-a-cidr", 0, false},
	}
	for _, c := range cases {
		got, err := processCIDRs(c.in)
		if (err == nil) != c.ok || len(got) != c.want {
			t.Errorf("processCIDRs(%q) = %v, %v; want %d CIDRs, ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestResyncPeriod(t *testing.T) {
	if got := resyncPeriod(0); got != 0 {
		t.Errorf("resyncPeriod(0) = %v, want 0 (disabled)", got)
	}
	for range 100 {
		got := resyncPeriod(time.Hour)
		if got < time.Hour || got >= 2*time.Hour {
			t.Fatalf("resyncPeriod(1h) = %v, outside [1h, 2h)", got)
		}
	}
}

func TestCloudFlag(t *testing.T) {
	cases := []struct {
		args []string
		ok   bool
	}{
		{nil, true},
		{[]string{"--cloud=memory"}, true},
		{[]string{"--cloud=hcloud", "--hcloud-network=4711"}, true},
		{[]string{"--cloud=hcloud"}, false}, // no network
		{[]string{"--cloud=gce"}, false},
	}
	for _, c := range cases {
		_, err := parseFlags(flag.NewFlagSet("t", flag.ContinueOnError), c.args)
		if (err == nil) != c.ok {
			t.Errorf("parseFlags(%v) = %v; want ok=%v", c.args, err, c.ok)
		}
	}
}
