//! `deploy/iam/neutron-policy.yaml` against the provider's table of
//! requests (`provider_openstack::permissions::REQUESTS`) and the policies
//! the pinned Neutron registers, and the table against what the provider
//! really sends to neutron-server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use provider_openstack::permissions::REQUESTS;
use provider_openstack::testing::{Admin, Proxy, neutron_server};
use provider_openstack::{OpenStackConfig, OpenStackRoutes, UpdateMode, ops};
use route_cloud::permissions::{permissions, unaccounted};
use route_cloud::{Batch, CloudRoutes};
use route_core::{NodeAddress, Route};
use serde_json::{Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Neutron's registered default for each of `names`, read by the pinned
/// Neutron's own policy module in the test virtualenv (installed by
/// `scripts/neutron.sh install` on first use); `null` for a name Neutron
/// does not register.
fn neutron_defaults(names: &[&str]) -> BTreeMap<String, Value> {
    let script = repo().join("scripts/neutron.sh");
    let install = std::process::Command::new("bash")
        .arg(&script)
        .arg("install")
        .status()
        .expect("running scripts/neutron.sh install");
    assert!(install.success(), "scripts/neutron.sh install: {install}");
    // The virtualenv scripts/neutron.sh builds: keyed by the pins' hash.
    let venv = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#"echo "${CRC_CACHE_DIR:-$HOME/.cache/cloud-route-controller}/venv-neutron-$(sha256sum "$1" | cut -c1-16)""#)
        .arg("venv")
        .arg(repo().join("tools/neutron/requirements.txt"))
        .output()
        .expect("the virtualenv's path");
    let python = PathBuf::from(String::from_utf8_lossy(&venv.stdout).trim()).join("bin/python");
    let out = std::process::Command::new(&python)
        .arg("-W")
        .arg("ignore")
        .arg("-c")
        .arg(
            "import json, sys\n\
             from neutron.conf import policies\n\
             rules = {r.name: r.check_str for r in policies.list_rules()}\n\
             print(json.dumps({n: rules.get(n) for n in sys.argv[1:]}))\n",
        )
        .args(names)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn the_policy_file_holds_exactly_the_rules_the_requests_hit_with_neutrons_defaults() {
    let path = repo().join("deploy/iam/neutron-policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let file: BTreeMap<String, String> =
        serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let needed: BTreeSet<&str> = permissions(REQUESTS);
    let listed: BTreeSet<&str> = file.keys().map(String::as_str).collect();
    assert_eq!(
        listed, needed,
        "neutron-policy.yaml's rules are the ones the requests hit"
    );
    let names: Vec<&str> = listed.iter().copied().collect();
    let defaults = neutron_defaults(&names);
    for (rule, value) in &file {
        assert_eq!(
            defaults.get(rule).and_then(Value::as_str),
            Some(value.as_str()),
            "{rule}: the pinned Neutron's default (null: Neutron has no such rule)"
        );
    }
}

/// A router found by name, a list, creations and deletions through both
/// write paths, each with its port pair: every request the server saw was
/// counted under a name with an entry, and every entry but Keystone's token
/// (no Keystone here; `tests/neutron.rs` runs a stand-in) and the port
/// re-read after a 412 (`tests/ports.rs`) is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_sent_to_neutron_has_an_entry() {
    let server = neutron_server().await.expect("neutron-server");
    let admin = Admin::new(&server.url);
    let router = admin
        .create_router(
            &format!("iam-{}", provider_openstack::testing::unique_project_id()),
            "10.0.0.0/16",
        )
        .await
        .expect("router");
    admin
        .create_ports(
            &router,
            &[
                ("srv-node-0".into(), "10.0.1.10".into(), json!([])),
                ("srv-node-1".into(), "10.0.1.11".into(), json!([])),
            ],
        )
        .await
        .unwrap();
    let proxy = Proxy::start(&server.url).await.unwrap();
    let route = |i: usize| {
        let mut r = Route::from_text(format!("node-{i}"), &format!("10.244.{i}.0/24"))
            .with_addresses(
                vec![NodeAddress::internal_ip(format!("10.0.1.{}", 10 + i))],
                false,
            );
        r.node_provider_id = Some(format!("openstack:///srv-node-{i}").into());
        r
    };
    let mut sent = BTreeSet::new();
    let mut counted = 0;
    for (i, mode) in [UpdateMode::Auto, UpdateMode::WholeList]
        .into_iter()
        .enumerate()
    {
        let mut c = OpenStackConfig::noauth(proxy.url(), &router.router_id);
        c.update_mode = mode;
        if mode == UpdateMode::Auto {
            c.router_id = None;
            c.router_name = Some(router.name.clone());
        }
        let p = OpenStackRoutes::new(c).unwrap();
        p.node_index().replace_all((0..2).map(|i| {
            (
                format!("node-{i}"),
                vec![NodeAddress::internal_ip(format!("10.0.1.{}", 10 + i))],
            )
        }));
        if mode == UpdateMode::Auto {
            p.list_routes("c").await.unwrap();
        }
        // The whole-list path reads the router first when it has not listed.
        let created = p
            .apply_batch("c", &Batch::one_creation("u", &route(i)))
            .await
            .unwrap();
        assert!(
            created.len() == 1 && created.values().all(Result::is_ok),
            "{created:?}"
        );
        let listed = p.list_routes("c").await.unwrap();
        let mine = listed
            .iter()
            .find(|r| r.node == format!("node-{i}"))
            .unwrap();
        let gone = p
            .apply_batch("c", &Batch::one_deletion(mine))
            .await
            .unwrap();
        assert!(
            gone.len() == 1 && gone.values().all(Result::is_ok),
            "{gone:?}"
        );
        for ((op, _), n) in p.stats().snapshot() {
            sent.insert(op);
            counted += n;
        }
    }
    assert_eq!(
        proxy.requests(),
        counted,
        "every request neutron-server saw was counted"
    );
    assert_eq!(unaccounted(REQUESTS, sent.iter().copied()), BTreeSet::new());
    let names: BTreeSet<&str> = REQUESTS.iter().map(|r| r.name).collect();
    let unsent: BTreeSet<&str> = names.difference(&sent).copied().collect();
    assert_eq!(unsent, BTreeSet::from([ops::AUTH, ops::GET_PORT]));
}
