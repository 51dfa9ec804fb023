//! The Azure role actions this provider's requests need, one entry per
//! [`crate::ops`] name the provider counts requests under.
//! `deploy/iam/azure-role.json` (the route table) and
//! `deploy/iam/azure-role-forwarding.json` (the Nodes' VMs and NICs, for the
//! forwarding check) grant exactly their union; `tests/permissions.rs`
//! drives the provider against the fake through every path, and
//! `cloud-route-controller`'s `tests/iam_policies.rs` checks the roles.
//!
//! ARM authorizes a request by its URL and method: a `PUT` of the whole
//! table, routes included, is `routeTables/write`. The
//! `routeTables/routes/*` actions upstream's permission list names belong to
//! the per-route endpoints this provider never calls; that ARM checks no
//! route action on a whole-table `PUT` is from ARM's model of actions, not a
//! run against Azure. Token requests go to Microsoft Entra ID (or the
//! instance metadata service), and the `Azure-AsyncOperation` status of a
//! write is read with the same authorization as the write: neither needs a
//! role action.

use route_cloud::{Access, RequestKind};

use crate::ops;

/// Every kind of request this provider sends.
pub const REQUESTS: &[RequestKind] = &[
    RequestKind {
        name: ops::TOKEN,
        call: "POST {authority}/{tenant}/oauth2/v2.0/token, or GET {imds}/metadata/identity/oauth2/token",
        access: Access::Read,
        permissions: &[],
        note: "an ARM token about once an hour; the identity's own credential, no role action",
    },
    RequestKind {
        name: ops::LIST,
        call: "GET .../providers/Microsoft.Network/routeTables/{t}",
        access: Access::Read,
        permissions: &["Microsoft.Network/routeTables/read"],
        note: "every list",
    },
    RequestKind {
        name: ops::GET_TABLE,
        call: "GET .../providers/Microsoft.Network/routeTables/{t}",
        access: Access::Read,
        permissions: &["Microsoft.Network/routeTables/read"],
        note: "a fresh ETag before a write and after a 412, and the result after a write",
    },
    RequestKind {
        name: ops::PUT_TABLE,
        call: "PUT .../providers/Microsoft.Network/routeTables/{t} with If-Match",
        access: Access::Write,
        permissions: &["Microsoft.Network/routeTables/write"],
        note: "every batch of creations and deletions: the whole table, routes embedded",
    },
    RequestKind {
        name: ops::POLL,
        call: "GET {Azure-AsyncOperation URL}",
        access: Access::Read,
        permissions: &[],
        note: "the status of a table write, until it ends",
    },
    RequestKind {
        name: ops::GET_VM,
        call: "GET .../providers/Microsoft.Compute/virtualMachines/{vm}",
        access: Access::Read,
        permissions: &["Microsoft.Compute/virtualMachines/read"],
        note: "the forwarding check: which NIC is a Node's primary, once per VM",
    },
    RequestKind {
        name: ops::GET_NIC,
        call: "GET .../providers/Microsoft.Network/networkInterfaces/{nic}",
        access: Access::Read,
        permissions: &["Microsoft.Network/networkInterfaces/read"],
        note: "the forwarding check: enableIPForwarding of the primary NIC, the first time",
    },
    RequestKind {
        name: ops::LIST_NICS,
        call: "GET .../resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces",
        access: Access::Read,
        permissions: &["Microsoft.Network/networkInterfaces/read"],
        note: "the forwarding check afresh (every drift check): every NIC read before, one list per resource group and page",
    },
];
