//! What this provider's requests need from a Hetzner Cloud API token. The
//! API has no finer permissions than a token's two: `Read` (GET) and
//! `Read & Write` (every method), both for one whole project. The entries
//! name the request kinds the provider counts; `deploy/iam/hcloud.md` lists
//! the same calls (checked by `cloud-route-controller`'s
//! `tests/iam_policies.rs`) and `tests/permissions.rs` drives the provider
//! against the fake through every path.

use route_cloud::{Access, RequestKind};

/// A token with `Read` or `Read & Write` permission.
pub const READ: &str = "Read";
/// A token with `Read & Write` permission.
pub const READ_WRITE: &str = "Read & Write";

/// Every kind of request this provider sends.
pub const REQUESTS: &[RequestKind] = &[
    RequestKind {
        name: "list_networks",
        call: "GET /v1/networks?name={name}",
        access: Access::Read,
        permissions: &[READ],
        note: "once, when the network is configured by name",
    },
    RequestKind {
        name: "get_network",
        call: "GET /v1/networks/{id}",
        access: Access::Read,
        permissions: &[READ],
        note: "every list: the network's routes and range",
    },
    RequestKind {
        name: "list_servers",
        call: "GET /v1/servers?page={n}&per_page=50",
        access: Access::Read,
        permissions: &[READ],
        note: "a gateway no route of this process names: which server has it (cached, at most every 30 s)",
    },
    RequestKind {
        name: "add_route",
        call: "POST /v1/networks/{id}/actions/add_route",
        access: Access::Write,
        permissions: &[READ_WRITE],
        note: "every route creation",
    },
    RequestKind {
        name: "delete_route",
        call: "POST /v1/networks/{id}/actions/delete_route",
        access: Access::Write,
        permissions: &[READ_WRITE],
        note: "every route deletion (and the old route before a gateway change)",
    },
    RequestKind {
        name: "get_action",
        call: "GET /v1/actions/{id}",
        access: Access::Read,
        permissions: &[READ],
        note: "following an add_route or delete_route action to its end",
    },
];
