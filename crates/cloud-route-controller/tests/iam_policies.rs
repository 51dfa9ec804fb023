//! The GCE custom role, the Azure role definitions and the Hetzner token
//! page in `deploy/iam/` against each provider's table of requests: a
//! permission a file grants that no request needs, or one a request needs
//! that no file grants, fails here. (The AWS policy and the Neutron rules
//! are checked in their providers' `tests/permissions.rs`, beside moto's
//! linter run and Neutron's registered defaults.)

use std::collections::BTreeSet;
use std::path::PathBuf;

use route_cloud::permissions::permissions;
use serde_json::Value;

fn read(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/iam")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn set<'a>(items: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    items.into_iter().map(str::to_string).collect()
}

#[test]
fn the_gce_role_includes_exactly_the_permissions_the_requests_need() {
    let role: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read("gce-role.yaml")).unwrap();
    for key in ["title", "description", "stage"] {
        assert!(role[key].as_str().is_some_and(|v| !v.is_empty()), "{key}");
    }
    let included: Vec<&str> = role["includedPermissions"]
        .as_sequence()
        .expect("includedPermissions is a list")
        .iter()
        .map(|p| p.as_str().expect("a permission name"))
        .collect();
    assert_eq!(
        included.len(),
        set(included.iter().copied()).len(),
        "no duplicates"
    );
    assert_eq!(
        set(included),
        set(permissions(provider_gce::permissions::REQUESTS))
    );
}

#[test]
fn the_azure_roles_grant_exactly_the_actions_the_requests_need_on_the_table_and_the_nodes() {
    let mut granted = Vec::new();
    for (file, scope) in [
        (
            "azure-role.json",
            "/providers/Microsoft.Network/routeTables/ROUTE_TABLE_NAME",
        ),
        (
            "azure-role-forwarding.json",
            "/resourceGroups/NODE_RESOURCE_GROUP",
        ),
    ] {
        let role: Value = serde_json::from_str(&read(file)).unwrap();
        assert_eq!(role["IsCustom"], true, "{file}");
        for none in ["NotActions", "DataActions", "NotDataActions"] {
            assert_eq!(role[none], serde_json::json!([]), "{file}: {none}");
        }
        let scopes = role["AssignableScopes"]
            .as_array()
            .expect("AssignableScopes");
        assert_eq!(scopes.len(), 1, "{file}: one scope");
        let s = scopes[0].as_str().unwrap();
        assert!(
            s.starts_with("/subscriptions/SUBSCRIPTION_ID/") && s.ends_with(scope),
            "{file}: {s}"
        );
        for a in role["Actions"].as_array().expect("Actions") {
            let a = a.as_str().expect("an action");
            assert!(!a.contains('*'), "{file}: {a} is a wildcard");
            granted.push(a.to_string());
        }
    }
    assert_eq!(
        granted.len(),
        set(granted.iter().map(String::as_str)).len(),
        "no action twice"
    );
    assert_eq!(
        set(granted.iter().map(String::as_str)),
        set(permissions(provider_azure::permissions::REQUESTS))
    );
}

#[test]
fn the_hetzner_page_lists_exactly_the_requests_with_the_token_each_needs() {
    let page = read("hcloud.md");
    let rows: BTreeSet<(String, String)> = page
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let call = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            (call.starts_with("GET ") || call.starts_with("POST ")).then(|| {
                (
                    call.to_string(),
                    cells.get(2).copied().unwrap_or_default().to_string(),
                )
            })
        })
        .collect();
    let table: BTreeSet<(String, String)> = provider_hcloud::permissions::REQUESTS
        .iter()
        .map(|r| (r.call.to_string(), r.permissions.join(", ")))
        .collect();
    assert_eq!(rows, table);
    assert!(page.contains("**Read & Write**"));
}
