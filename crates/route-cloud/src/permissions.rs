//! What each kind of request a provider sends needs from the cloud's access
//! control, so the policies shipped in `deploy/iam/` can be derived from, and
//! checked against, the code that sends the requests.
//!
//! Every provider crate owns one table, `REQUESTS: &[RequestKind]`, in a
//! `permissions` module next to the code that sends them. An entry is keyed
//! by the name the provider counts the request under in its
//! [`crate::RequestStats`] (and the name its fake or test proxy counts it
//! under), so a test can drive the provider against its server and check
//! that every request it saw has an entry, and that every entry was seen.
//! The union of the entries' permissions is what the shipped policy must
//! grant: no more, no less.

use std::collections::BTreeSet;

/// Whether a request only reads or also changes something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Reads only (a list, a get, a token or operation poll).
    Read,
    /// Changes something in the cloud.
    Write,
}

impl Access {
    /// `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// One kind of request a provider sends and the permissions the cloud checks
/// before it answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestKind {
    /// The operation name the provider records in its request counters.
    pub name: &'static str,
    /// The API call: the action, or the HTTP method and path.
    pub call: &'static str,
    /// Whether it changes anything.
    pub access: Access,
    /// The cloud's names of the permissions it needs (IAM actions, IAM
    /// permissions, role actions or policy rules); empty when the cloud
    /// checks none (a token request, an operation poll).
    pub permissions: &'static [&'static str],
    /// When the provider sends it, and why it needs what it needs.
    pub note: &'static str,
}

/// Every permission some request of `table` needs, sorted.
pub fn permissions(table: &[RequestKind]) -> BTreeSet<&'static str> {
    table
        .iter()
        .flat_map(|r| r.permissions.iter().copied())
        .collect()
}

/// The entry for the request counted as `name`.
pub fn request_kind<'a>(table: &'a [RequestKind], name: &str) -> Option<&'a RequestKind> {
    table.iter().find(|r| r.name == name)
}

/// The names of `seen` that have no entry in `table`: requests the code sent
/// that the table (and so the policy) does not account for.
pub fn unaccounted<'a>(
    table: &[RequestKind],
    seen: impl IntoIterator<Item = &'a str>,
) -> BTreeSet<&'a str> {
    seen.into_iter()
        .filter(|s| request_kind(table, s).is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[RequestKind] = &[
        RequestKind {
            name: "list",
            call: "GET /things",
            access: Access::Read,
            permissions: &["things.list"],
            note: "",
        },
        RequestKind {
            name: "insert",
            call: "POST /things",
            access: Access::Write,
            permissions: &["things.create", "network.use"],
            note: "",
        },
        RequestKind {
            name: "token",
            call: "POST /token",
            access: Access::Read,
            permissions: &[],
            note: "",
        },
    ];

    #[test]
    fn the_union_of_permissions_is_sorted_and_free_of_duplicates() {
        assert_eq!(
            permissions(TABLE).into_iter().collect::<Vec<_>>(),
            ["network.use", "things.create", "things.list"]
        );
    }

    #[test]
    fn a_request_without_an_entry_is_unaccounted() {
        assert_eq!(
            unaccounted(TABLE, ["list", "token", "delete"])
                .into_iter()
                .collect::<Vec<_>>(),
            ["delete"]
        );
        assert_eq!(
            request_kind(TABLE, "insert").map(|r| r.access),
            Some(Access::Write)
        );
    }
}
