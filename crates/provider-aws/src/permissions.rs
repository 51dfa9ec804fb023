//! The IAM actions this provider's requests need: one entry per EC2 action
//! it sends (its `Op`s), each needing exactly the IAM action of the same
//! name. `deploy/iam/aws-policy.json` grants exactly their union; the
//! crate's `tests/permissions.rs` drives the provider against moto through
//! every path and checks both directions, and the unit test below ties the
//! table to the `Op` enum the request counters and budgets use.
//!
//! Scoping (the Service Authorization Reference for EC2): the three route
//! writes take the `route-table` resource and its tags as conditions, so the
//! policy limits them to tables tagged for the cluster; the two attribute
//! writes take the `instance` and `network-interface` resources; the three
//! describes support no resource-level permissions and need `"*"`.

use route_cloud::{Access, RequestKind};

/// Every kind of EC2 request this provider sends, by action name.
pub const REQUESTS: &[RequestKind] = &[
    RequestKind {
        name: "DescribeRouteTables",
        call: "DescribeRouteTables",
        access: Access::Read,
        permissions: &["ec2:DescribeRouteTables"],
        note: "every list (the configured ids, or filtered by the cluster tag), table discovery, and one read after RouteAlreadyExists",
    },
    RequestKind {
        name: "DescribeInstances",
        call: "DescribeInstances",
        access: Access::Read,
        permissions: &["ec2:DescribeInstances"],
        note: "the forwarding check (source/destination check per instance), a multi-NIC instance's primary interface, the cluster tags of an instance no Node names, a Node without a providerID by private DNS name",
    },
    RequestKind {
        name: "DescribeNetworkInterfaces",
        call: "DescribeNetworkInterfaces",
        access: Access::Read,
        permissions: &["ec2:DescribeNetworkInterfaces"],
        note: "a listed route that names only a network interface not seen before: which instance it belongs to",
    },
    RequestKind {
        name: "CreateRoute",
        call: "CreateRoute",
        access: Access::Write,
        permissions: &["ec2:CreateRoute"],
        note: "every route creation",
    },
    RequestKind {
        name: "ReplaceRoute",
        call: "ReplaceRoute",
        access: Access::Write,
        permissions: &["ec2:ReplaceRoute"],
        note: "a creation over a blackhole, or over this cluster's route to an instance no Node names",
    },
    RequestKind {
        name: "DeleteRoute",
        call: "DeleteRoute",
        access: Access::Write,
        permissions: &["ec2:DeleteRoute"],
        note: "every route deletion",
    },
    RequestKind {
        name: "ModifyInstanceAttribute",
        call: "ModifyInstanceAttribute SourceDestCheck=false",
        access: Access::Write,
        permissions: &["ec2:ModifyInstanceAttribute"],
        note: "the forwarding prerequisite: the source/destination check off before an instance's first route, and turned off again when found on",
    },
    RequestKind {
        name: "ModifyNetworkInterfaceAttribute",
        call: "ModifyNetworkInterfaceAttribute SourceDestCheck=false",
        access: Access::Write,
        permissions: &["ec2:ModifyNetworkInterfaceAttribute"],
        note: "the same on a multi-NIC instance's primary interface, which EC2 routes to instead of the instance",
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Op;

    #[test]
    fn every_ec2_action_the_provider_can_send_has_exactly_one_entry() {
        let ops: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
        let names: Vec<&str> = REQUESTS.iter().map(|r| r.name).collect();
        assert_eq!(names, ops, "the table follows Op::ALL, in order");
        for op in Op::ALL {
            let entry = route_cloud::permissions::request_kind(REQUESTS, op.name())
                .unwrap_or_else(|| panic!("{} has no entry", op.name()));
            assert_eq!(
                entry.access == Access::Write,
                op.is_write(),
                "{}: read/write as its budget",
                op.name()
            );
            assert_eq!(entry.permissions, [format!("ec2:{}", op.name()).as_str()]);
        }
    }
}
