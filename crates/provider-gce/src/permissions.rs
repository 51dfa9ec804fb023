//! The IAM permissions this provider's requests need, one entry per kind of
//! request, keyed by the name the provider counts it under (and the fake
//! serves it under). `deploy/iam/gce-role.yaml` is a custom role of exactly
//! their union; `tests/permissions.rs` drives the provider against the fake
//! through every path and checks every request it saw has an entry, and
//! `cloud-route-controller`'s `tests/iam_policies.rs` checks the role.
//!
//! Which permission each method checks is the Compute Engine API
//! reference's (each method's "Authorization" section);
//! `compute.networks.updatePolicy` on `routes.insert` is from a crawl of that
//! reference and was not read on the page itself. Routes, networks and
//! operations live in the network's project (`network_project`), instances
//! in each Node's project: the role is granted on both when they differ.

use route_cloud::{Access, RequestKind};

/// Every kind of Compute Engine request this provider sends.
pub const REQUESTS: &[RequestKind] = &[
    RequestKind {
        name: "get_network",
        call: "GET projects/{p}/global/networks/{n} (networks.get)",
        access: Access::Read,
        permissions: &["compute.networks.get"],
        note: "once at start: the network's URL and whether it has an internal IPv6 range",
    },
    RequestKind {
        name: "list",
        call: "GET projects/{p}/global/routes?filter= (routes.list)",
        access: Access::Read,
        permissions: &["compute.routes.list"],
        note: "every list, one per page of 500",
    },
    RequestKind {
        name: "get_route",
        call: "GET projects/{p}/global/routes/{r} (routes.get)",
        access: Access::Read,
        permissions: &["compute.routes.get"],
        note: "after an insert answered alreadyExists: whether the route behind the name is the one asked for",
    },
    RequestKind {
        name: "insert",
        call: "POST projects/{p}/global/routes (routes.insert)",
        access: Access::Write,
        permissions: &["compute.routes.create", "compute.networks.updatePolicy"],
        note: "every route creation; a route changes its network's routing, checked as updatePolicy on the network",
    },
    RequestKind {
        name: "delete",
        call: "DELETE projects/{p}/global/routes/{r} (routes.delete)",
        access: Access::Write,
        permissions: &["compute.routes.delete"],
        note: "every route deletion",
    },
    RequestKind {
        name: "wait_operation",
        call: "POST projects/{p}/global/operations/{o}/wait (globalOperations.wait)",
        access: Access::Read,
        permissions: &["compute.globalOperations.get"],
        note: "following each insert's and delete's operation to its end",
    },
    RequestKind {
        name: "get_instance",
        call: "GET projects/{p}/zones/{z}/instances/{i} (instances.get)",
        access: Access::Read,
        permissions: &["compute.instances.get"],
        note: "the forwarding check: canIpForward of each Node's instance, read once (again while found off)",
    },
];
