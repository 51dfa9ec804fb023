// Command azure-wire-check drives an ARM endpoint (the provider's fake, in
// the project's tests) with the official Azure SDK for Go, so the requests
// and the answers checked are the SDK's wire format, not the project's own
// client's. It prints one line per check ("ok <check>: ...") and exits 1 at
// the first mismatch with "FAIL <check>: ...".
//
// The SDK's ARM pipeline is used unmodified (bearer-token, retry, request-id
// and registration policies, the long-running-operation poller); a policy in
// PerRetryPolicies only records each try, so the checks can say what went
// over the wire. The client secret is read from AZURE_CLIENT_SECRET.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/runtime"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v6"
)

// try is one HTTP exchange as the SDK's retry policy made it.
type try struct {
	method, path, query string
	status              int
	code                string // error.code of an error answer
	opStatus            string // status of an operation-status answer
	asyncOp, retryAfter string
	at                  time.Time
}

// recorder is a per-try policy: it sees every attempt, retries included.
type recorder struct {
	mu    sync.Mutex
	tries []try
}

func (r *recorder) Do(req *policy.Request) (*http.Response, error) {
	resp, err := req.Next()
	if err != nil {
		return resp, err
	}
	t := try{
		method:     req.Raw().Method,
		path:       req.Raw().URL.Path,
		query:      req.Raw().URL.RawQuery,
		status:     resp.StatusCode,
		asyncOp:    resp.Header.Get("Azure-AsyncOperation"),
		retryAfter: resp.Header.Get("Retry-After"),
		at:         time.Now(),
	}
	// Payload buffers the body, so the SDK still reads it afterwards.
	if body, perr := runtime.Payload(resp); perr == nil {
		var doc struct {
			Status string `json:"status"`
			Error  struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &doc) == nil {
			t.code, t.opStatus = doc.Error.Code, doc.Status
		}
	}
	r.mu.Lock()
	r.tries = append(r.tries, t)
	r.mu.Unlock()
	return resp, nil
}

// take returns the tries since the last call and forgets them.
func (r *recorder) take() []try {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.tries
	r.tries = nil
	return out
}

// tokenSource is an azcore.TokenCredential that asks the authority's
// client-credentials endpoint for a token with the scopes the SDK's bearer
// policy requests. azidentity is not used: it refuses authority hosts that
// are not HTTPS, and the fake speaks plain HTTP.
type tokenSource struct {
	authority, tenant, clientID, secret string
	mu                                  sync.Mutex
	scopes                              [][]string
}

func (s *tokenSource) GetToken(ctx context.Context, o policy.TokenRequestOptions) (azcore.AccessToken, error) {
	s.mu.Lock()
	s.scopes = append(s.scopes, o.Scopes)
	s.mu.Unlock()
	form := url.Values{
		"grant_type":    {"client_credentials"},
		"client_id":     {s.clientID},
		"client_secret": {s.secret},
		"scope":         {strings.Join(o.Scopes, " ")},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		s.authority+"/"+s.tenant+"/oauth2/v2.0/token", strings.NewReader(form.Encode()))
	if err != nil {
		return azcore.AccessToken{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return azcore.AccessToken{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return azcore.AccessToken{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return azcore.AccessToken{}, fmt.Errorf("token endpoint answered %d: %s", resp.StatusCode, body)
	}
	var tr struct {
		TokenType   string `json:"token_type"`
		ExpiresIn   int64  `json:"expires_in"`
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(body, &tr); err != nil {
		return azcore.AccessToken{}, fmt.Errorf("token answer: %w", err)
	}
	if tr.TokenType != "Bearer" || tr.AccessToken == "" || tr.ExpiresIn <= 0 {
		return azcore.AccessToken{}, fmt.Errorf("token answer lacks token_type Bearer, access_token or expires_in")
	}
	return azcore.AccessToken{Token: tr.AccessToken, ExpiresOn: time.Now().Add(time.Duration(tr.ExpiresIn) * time.Second)}, nil
}

func fail(check, format string, args ...any) {
	fmt.Printf("FAIL %s: %s\n", check, fmt.Sprintf(format, args...))
	os.Exit(1)
}

func ok(check, format string, args ...any) {
	fmt.Printf("ok %s: %s\n", check, fmt.Sprintf(format, args...))
}

func statuses(ts []try) []string {
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		s := fmt.Sprintf("%s %d", t.method, t.status)
		if t.code != "" {
			s += " " + t.code
		}
		out = append(out, s)
	}
	return out
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func findRoute(rt armnetwork.RouteTable, name string) *armnetwork.Route {
	if rt.Properties == nil {
		return nil
	}
	for _, r := range rt.Properties.Routes {
		if r != nil && strings.EqualFold(str(r.Name), name) {
			return r
		}
	}
	return nil
}

// responseError unwraps err into the SDK's *azcore.ResponseError.
func responseError(check string, err error) *azcore.ResponseError {
	var re *azcore.ResponseError
	if err == nil {
		fail(check, "the call succeeded; an error answer was expected")
	}
	if !errors.As(err, &re) {
		fail(check, "the error is not an *azcore.ResponseError: %v", err)
	}
	return re
}

func main() {
	endpoint := flag.String("endpoint", "", "ARM endpoint and authority host, e.g. http://127.0.0.1:PORT")
	tenant := flag.String("tenant", "", "tenant id")
	clientID := flag.String("client-id", "", "application (client) id")
	subscription := flag.String("subscription", "", "subscription id")
	group := flag.String("resource-group", "", "resource group of the table")
	table := flag.String("table", "", "an existing route table")
	missing := flag.String("missing-table", "no-such-table", "a route table that does not exist")
	route := flag.String("route", "node-wire-check", "name of the route the check adds and removes")
	prefix := flag.String("prefix", "10.244.250.0/24", "addressPrefix of that route")
	hop := flag.String("next-hop", "10.0.0.250", "nextHopIpAddress of that route (VirtualAppliance)")
	throttled := flag.Bool("throttled-get", false, "the first GET of the table is answered 429 with Retry-After; the SDK must retry it")
	flag.Parse()
	secret := os.Getenv("AZURE_CLIENT_SECRET")
	if *endpoint == "" || *tenant == "" || *clientID == "" || *subscription == "" || *group == "" || *table == "" || secret == "" {
		fmt.Fprintln(os.Stderr, "usage: azure-wire-check -endpoint URL -tenant ID -client-id ID -subscription ID -resource-group RG -table NAME [-throttled-get] (AZURE_CLIENT_SECRET in the environment)")
		os.Exit(2)
	}
	base := strings.TrimRight(*endpoint, "/")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	rec := &recorder{}
	cred := &tokenSource{authority: base, tenant: *tenant, clientID: *clientID, secret: secret}
	opts := &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud: cloud.Configuration{
			ActiveDirectoryAuthorityHost: base + "/",
			Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
				cloud.ResourceManager: {Endpoint: base, Audience: base},
			},
		},
		// The fake is plain HTTP; the SDK refuses to send a bearer token over it otherwise.
		InsecureAllowCredentialWithHTTP: true,
		// The SDK's defaults except the backoff without Retry-After, kept short.
		Retry:            policy.RetryOptions{MaxRetries: 3, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 30 * time.Second},
		PerRetryPolicies: []policy.Policy{rec},
	}}
	tables, err := armnetwork.NewRouteTablesClient(*subscription, cred, opts)
	if err != nil {
		fail("client", "NewRouteTablesClient: %v", err)
	}
	tablePath := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/routeTables/%s", *subscription, *group, *table)

	// 1. GET the table (throttled once when asked: the retry policy waits Retry-After).
	got, err := tables.Get(ctx, *group, *table, nil)
	if err != nil {
		fail("get", "Get: %v", err)
	}
	tries := rec.take()
	if *throttled {
		if len(tries) != 2 || tries[0].status != http.StatusTooManyRequests || tries[1].status != http.StatusOK {
			fail("throttled-get-retried", "want tries [GET 429, GET 200], got %v", statuses(tries))
		}
		if tries[0].code != "SubscriptionRequestsThrottled" {
			fail("throttled-get-retried", "the 429 has error code %q, want SubscriptionRequestsThrottled", tries[0].code)
		}
		// Retry-After is seconds or an HTTP date (RFC 9110); the SDK reads both.
		var ra time.Duration
		if secs, perr := strconv.Atoi(tries[0].retryAfter); perr == nil {
			ra = time.Duration(secs) * time.Second
		} else if date, derr := http.ParseTime(tries[0].retryAfter); derr == nil {
			ra = date.Sub(tries[0].at)
		}
		if ra <= 0 {
			fail("throttled-get-retried", "the 429 has no usable Retry-After (%q)", tries[0].retryAfter)
		}
		if waited := tries[1].at.Sub(tries[0].at); waited < ra {
			fail("throttled-get-retried", "retried after %v, before Retry-After %v", waited, ra)
		}
		ok("throttled-get-retried", "GET 429 %s with Retry-After %q, retried by the SDK's retry policy %v later, then GET 200", tries[0].code, tries[0].retryAfter, tries[1].at.Sub(tries[0].at).Round(time.Millisecond))
	} else if len(tries) != 1 || tries[0].status != http.StatusOK {
		fail("get", "want one try GET 200, got %v", statuses(tries))
	}
	if !strings.Contains(tries[len(tries)-1].query, "api-version=") {
		fail("get", "the SDK sent no api-version: %q", tries[len(tries)-1].query)
	}
	rt := got.RouteTable
	if str(rt.Etag) == "" || rt.Properties == nil || str(rt.Name) != *table || !strings.EqualFold(str(rt.ID), tablePath) ||
		rt.Properties.ProvisioningState == nil || *rt.Properties.ProvisioningState != armnetwork.ProvisioningStateSucceeded ||
		str(rt.Location) == "" {
		fail("get", "the table does not decode as the SDK expects: name %q id %q etag %q location %q", str(rt.Name), str(rt.ID), str(rt.Etag), str(rt.Location))
	}
	if findRoute(rt, *route) != nil {
		fail("get", "route %s is already in the table", *route)
	}
	scopes := cred.scopes
	if len(scopes) != 1 || len(scopes[0]) != 1 || scopes[0][0] != base+"/.default" {
		fail("token", "the SDK asked for tokens with scopes %v; want one request for [%s/.default]", scopes, base)
	}
	ok("token", "one token from %s/%s/oauth2/v2.0/token for scope %s", base, *tenant, scopes[0][0])
	ok("get", "GET %s (%s): etag %s, %d routes, %d subnets, provisioningState %s", tablePath, tries[len(tries)-1].query,
		*rt.Etag, len(rt.Properties.Routes), len(rt.Properties.Subnets), *rt.Properties.ProvisioningState)
	firstEtag := *rt.Etag

	// 2. PUT the table with one more route, If-Match the ETag, and poll the operation.
	nextHopType := armnetwork.RouteNextHopTypeVirtualAppliance
	rt.Properties.Routes = append(rt.Properties.Routes, &armnetwork.Route{
		Name: route,
		Properties: &armnetwork.RoutePropertiesFormat{
			AddressPrefix:    prefix,
			NextHopType:      &nextHopType,
			NextHopIPAddress: hop,
		},
	})
	ifMatch := func(etag string) context.Context {
		return runtime.WithHTTPHeader(ctx, http.Header{"If-Match": {etag}})
	}
	poller, err := tables.BeginCreateOrUpdate(ifMatch(firstEtag), *group, *table, rt, nil)
	if err != nil {
		fail("put-if-match", "BeginCreateOrUpdate: %v", err)
	}
	tries = rec.take()
	if len(tries) != 1 || tries[0].method != http.MethodPut || tries[0].status != http.StatusOK {
		fail("put-if-match", "want one try PUT 200, got %v", statuses(tries))
	}
	asyncOp := tries[0].asyncOp
	opURL, perr := url.Parse(asyncOp)
	if asyncOp == "" || perr != nil {
		fail("put-if-match", "the PUT answer has no usable Azure-AsyncOperation header (%q)", asyncOp)
	}
	ok("put-if-match", "PUT with If-Match %s answered 200 with Azure-AsyncOperation %s and Retry-After %q", firstEtag, opURL.Path, tries[0].retryAfter)
	done, err := poller.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: time.Second})
	if err != nil {
		fail("poll-until-done", "PollUntilDone: %v", err)
	}
	tries = rec.take()
	polls, inProgress := 0, 0
	for i, t := range tries {
		switch {
		case t.method == http.MethodGet && t.path == opURL.Path:
			if t.status != http.StatusOK || (t.opStatus != "InProgress" && t.opStatus != "Succeeded") {
				fail("poll-until-done", "operation status answer %d %q", t.status, t.opStatus)
			}
			polls++
			if t.opStatus == "InProgress" {
				inProgress++
			}
		case t.method == http.MethodGet && strings.EqualFold(t.path, tablePath) && i == len(tries)-1:
			// The final GET on the original URL, which a PUT's poller makes.
		default:
			fail("poll-until-done", "unexpected try %s %s %d", t.method, t.path, t.status)
		}
	}
	if polls == 0 || tries[len(tries)-1].path == opURL.Path || tries[len(tries)-2].opStatus != "Succeeded" {
		fail("poll-until-done", "want operation polls ending Succeeded, then a GET of the table; got %v", statuses(tries))
	}
	r := findRoute(done.RouteTable, *route)
	if r == nil || r.Properties == nil || r.Properties.ProvisioningState == nil || *r.Properties.ProvisioningState != armnetwork.ProvisioningStateSucceeded {
		fail("poll-until-done", "the final table lacks route %s in provisioningState Succeeded", *route)
	}
	if str(done.Etag) == "" || str(done.Etag) == firstEtag {
		fail("poll-until-done", "the ETag did not change with the write (%q)", str(done.Etag))
	}
	ok("poll-until-done", "%d polls of the operation (%d InProgress) ended Succeeded; the final GET has route %s Succeeded, etag %s", polls, inProgress, *route, *done.Etag)

	// 3. GET again: the route as written.
	again, err := tables.Get(ctx, *group, *table, nil)
	if err != nil {
		fail("get-after-put", "Get: %v", err)
	}
	rec.take()
	r = findRoute(again.RouteTable, *route)
	if r == nil || r.Properties == nil || str(r.Properties.AddressPrefix) != *prefix ||
		r.Properties.NextHopType == nil || *r.Properties.NextHopType != armnetwork.RouteNextHopTypeVirtualAppliance ||
		str(r.Properties.NextHopIPAddress) != *hop || !strings.EqualFold(str(r.ID), tablePath+"/routes/"+*route) {
		fail("get-after-put", "route %s is not in the table as written", *route)
	}
	if str(again.Etag) != str(done.Etag) {
		fail("get-after-put", "etag %s differs from the poller's final %s", str(again.Etag), str(done.Etag))
	}
	ok("get-after-put", "route %s %s VirtualAppliance %s, id %s", *route, *prefix, *hop, str(r.ID))

	// 4. A stale ETag: 412 PreconditionFailed, not retried, no poller.
	_, err = tables.BeginCreateOrUpdate(ifMatch(firstEtag), *group, *table, rt, nil)
	re := responseError("stale-etag-412", err)
	tries = rec.take()
	if re.StatusCode != http.StatusPreconditionFailed || re.ErrorCode != "PreconditionFailed" || len(tries) != 1 {
		fail("stale-etag-412", "want one try answered 412 PreconditionFailed, got %d %q after %v", re.StatusCode, re.ErrorCode, statuses(tries))
	}
	ok("stale-etag-412", "PUT with If-Match %s: *azcore.ResponseError %d %s, not retried", firstEtag, re.StatusCode, re.ErrorCode)

	// 5. A missing table: 404 ResourceNotFound.
	_, err = tables.Get(ctx, *group, *missing, nil)
	re = responseError("missing-table-404", err)
	tries = rec.take()
	if re.StatusCode != http.StatusNotFound || re.ErrorCode != "ResourceNotFound" || len(tries) != 1 {
		fail("missing-table-404", "want one try answered 404 ResourceNotFound, got %d %q after %v", re.StatusCode, re.ErrorCode, statuses(tries))
	}
	ok("missing-table-404", "GET %s: *azcore.ResponseError %d %s", *missing, re.StatusCode, re.ErrorCode)

	// 6. Two writes back to back: the second meets the first's running
	// operation (429 RetryableErrorDueToAnotherOperation with Retry-After),
	// which the SDK's retry policy retries once the operation is done. The
	// second removes the route again, leaving the table as found.
	current := again.RouteTable
	first, err := tables.BeginCreateOrUpdate(ifMatch(str(current.Etag)), *group, *table, current, nil)
	if err != nil {
		fail("put-during-operation-retried", "first BeginCreateOrUpdate: %v", err)
	}
	rec.take()
	kept := current.Properties.Routes[:0:0]
	for _, x := range current.Properties.Routes {
		if !strings.EqualFold(str(x.Name), *route) {
			kept = append(kept, x)
		}
	}
	current.Properties.Routes = kept
	second, err := tables.BeginCreateOrUpdate(ctx, *group, *table, current, nil)
	if err != nil {
		fail("put-during-operation-retried", "second BeginCreateOrUpdate: %v", err)
	}
	tries = rec.take()
	if len(tries) < 2 || tries[0].status != http.StatusTooManyRequests || tries[0].code != "RetryableError" || tries[len(tries)-1].status != http.StatusOK {
		fail("put-during-operation-retried", "want [PUT 429 RetryableError, ..., PUT 200], got %v", statuses(tries))
	}
	if _, err := first.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: time.Second}); err != nil {
		fail("put-during-operation-retried", "first PollUntilDone: %v", err)
	}
	final, err := second.PollUntilDone(ctx, &runtime.PollUntilDoneOptions{Frequency: time.Second})
	if err != nil {
		fail("put-during-operation-retried", "second PollUntilDone: %v", err)
	}
	rec.take()
	if findRoute(final.RouteTable, *route) != nil {
		fail("put-during-operation-retried", "route %s is still in the table after the second write", *route)
	}
	ok("put-during-operation-retried", "second PUT answered %v by the SDK's retries; route %s removed", statuses(tries), *route)

	fmt.Println("all checks passed")
}
