//! The Neutron policy rules this provider's requests are checked against,
//! one entry per [`crate::ops`] name the provider counts requests under.
//! `deploy/iam/neutron-policy.yaml` holds exactly their union with
//! Neutron's defaults; `tests/permissions.rs` checks the file against both
//! this table and the policies the pinned Neutron registers, and drives the
//! provider against neutron-server.
//!
//! Keystone's token request and Neutron's extension list are checked
//! against no Neutron rule. A port update sends back the port's whole
//! `allowed_address_pairs`, whose pairs Neutron returns with their
//! `mac_address`, so both per-field rules apply.

use route_cloud::{Access, RequestKind};

use crate::ops;

/// Every kind of request this provider sends.
pub const REQUESTS: &[RequestKind] = &[
    RequestKind {
        name: ops::AUTH,
        call: "POST /v3/auth/tokens (Keystone)",
        access: Access::Read,
        permissions: &[],
        note: "a token, when it nears its expiry; the credential's own, no Neutron rule",
    },
    RequestKind {
        name: ops::FIND_ROUTER,
        call: "GET /v2.0/routers?name={name}",
        access: Access::Read,
        permissions: &["get_router"],
        note: "once, when the router is configured by name",
    },
    RequestKind {
        name: ops::EXTENSIONS,
        call: "GET /v2.0/extensions",
        access: Access::Read,
        permissions: &[],
        note: "once: extraroute-atomic and allowed-address-pairs",
    },
    RequestKind {
        name: ops::LIST,
        call: "GET /v2.0/routers/{id}",
        access: Access::Read,
        permissions: &["get_router"],
        note: "every list, per router",
    },
    RequestKind {
        name: ops::GET_ROUTER,
        call: "GET /v2.0/routers/{id}",
        access: Access::Read,
        permissions: &["get_router"],
        note: "a fresh revision before a whole-list update and after a 412",
    },
    RequestKind {
        name: ops::ADD_EXTRAROUTES,
        call: "PUT /v2.0/routers/{id}/add_extraroutes",
        access: Access::Write,
        permissions: &["add_extraroutes"],
        note: "creations, with extraroute-atomic",
    },
    RequestKind {
        name: ops::REMOVE_EXTRAROUTES,
        call: "PUT /v2.0/routers/{id}/remove_extraroutes",
        access: Access::Write,
        permissions: &["remove_extraroutes"],
        note: "deletions, with extraroute-atomic",
    },
    RequestKind {
        name: ops::UPDATE_ROUTER,
        call: "PUT /v2.0/routers/{id} with the whole routes list and If-Match",
        access: Access::Write,
        permissions: &["update_router"],
        note: "creations and deletions without extraroute-atomic (or update_mode: whole_list)",
    },
    RequestKind {
        name: ops::ROUTER_PORTS,
        call: "GET /v2.0/ports?device_id={router}",
        access: Access::Read,
        permissions: &["get_port"],
        note: "the routers' interface networks, where next hops' ports are",
    },
    RequestKind {
        name: ops::LIST_PORTS,
        call: "GET /v2.0/ports?network_id={n}&fixed_ips=ip_address={hop}",
        access: Access::Read,
        permissions: &["get_port"],
        note: "the ports carrying the next hops: their allowed address pairs",
    },
    RequestKind {
        name: ops::GET_PORT,
        call: "GET /v2.0/ports/{id}",
        access: Access::Read,
        permissions: &["get_port"],
        note: "a port read again after a 412 on its update",
    },
    RequestKind {
        name: ops::UPDATE_PORT,
        call: "PUT /v2.0/ports/{id} with the whole allowed_address_pairs list and If-Match",
        access: Access::Write,
        permissions: &[
            "update_port",
            "update_port:allowed_address_pairs",
            "update_port:allowed_address_pairs:ip_address",
            "update_port:allowed_address_pairs:mac_address",
        ],
        note: "the forwarding prerequisite: each route's pod CIDR as a pair on its next hop's port, added and removed with the route",
    },
];
