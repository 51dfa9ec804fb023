//! The docs point at real things: every path CONTRIBUTING.md, README.md and
//! docs/ name exists, every relative link lands on a file (and a heading),
//! and every test CONTRIBUTING.md says checks a row is defined where it
//! says.

use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// Backticked spans of `text`.
fn spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Spans that name a file or directory of the repository.
fn paths(text: &str) -> Vec<&str> {
    spans(text)
        .into_iter()
        .filter(|s| {
            ["crates/", "scripts/", "tools/", "deploy/", "fuzz/"]
                .iter()
                .any(|p| s.starts_with(p))
                && !s.contains(['<', '*', ' '])
        })
        .map(|s| s.trim_end_matches('/'))
        .collect()
}

#[test]
fn every_path_the_docs_name_exists() {
    let mut docs: Vec<String> = [
        "CONTRIBUTING.md",
        "README.md",
        "CHANGELOG.md",
        "SECURITY.md",
        "deploy/helm/cloud-route-controller/README.md",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    docs.extend(markdown_in("docs"));
    for doc in &docs {
        let doc = doc.as_str();
        let text = std::fs::read_to_string(root().join(doc)).expect("read the doc");
        let named = paths(&text);
        let missing: Vec<&str> = named
            .into_iter()
            .filter(|p| !root().join(p).exists())
            .collect();
        assert!(
            missing.is_empty(),
            "{doc} names paths that do not exist: {missing:?}"
        );
    }
}

#[test]
fn every_check_contributing_names_is_a_test_that_exists() {
    let text = std::fs::read_to_string(root().join("CONTRIBUTING.md")).expect("read the doc");
    let mut checked = 0;
    for span in spans(&text) {
        // `module::tests::name`: a unit test of crates/route-controller.
        let Some((module, name)) = span.split_once("::tests::") else {
            continue;
        };
        let file = root().join(format!("crates/route-controller/src/{module}.rs"));
        let src = std::fs::read_to_string(&file).expect("the module CONTRIBUTING.md names");
        assert!(
            src.contains(&format!("fn {name}()")),
            "CONTRIBUTING.md names {span}, which {} does not define",
            file.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "the metrics and Warning rows name their tests"
    );
}

/// docs/operating.md's table of which routes each provider can ever delete
/// names, per row, the tests that pin it; each is defined in the file
/// named beside it.
#[test]
fn every_test_the_ownership_table_names_is_defined_where_it_says() {
    let text = std::fs::read_to_string(root().join("docs/operating.md")).expect("read the doc");
    let table = text
        .split_once("| provider | deleted when inside `--cluster-cidr`")
        .expect("docs/operating.md's ownership table")
        .1;
    let mut pinned = 0;
    for row in table
        .lines()
        .skip(2)
        .take_while(|l| l.trim_start().starts_with('|'))
    {
        let last = row
            .trim()
            .trim_end_matches('|')
            .rsplit(" | ")
            .next()
            .unwrap_or_default();
        let mut file: Option<String> = None;
        for span in spans(last) {
            if span.starts_with("crates/") && span.ends_with(".rs") {
                file = Some(std::fs::read_to_string(root().join(span)).expect("the named file"));
                continue;
            }
            let src = file
                .as_deref()
                .unwrap_or_else(|| panic!("{span}: no file before it in {row}"));
            assert!(
                src.contains(&format!("fn {span}(")),
                "the ownership table names {span}, which its file does not define"
            );
            pinned += 1;
        }
    }
    assert!(pinned >= 5, "every provider's row names a test: {pinned}");
}

/// The anchors GitHub gives the headings of a Markdown text.
fn anchors(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// The troubleshooting page answers every condition reason, every Warning
/// reason and every alert, each alert's `runbook_url` points at its
/// section, and every in-page link lands on a heading.
#[test]
fn troubleshooting_covers_every_reason_warning_and_alert_and_runbook_urls_land_on_it() {
    let page = std::fs::read_to_string(root().join("docs/troubleshooting.md")).expect("read it");
    let headings = anchors(&page);
    for c in route_core::NetworkCondition::ALL {
        assert!(
            headings.contains(&c.reason().to_lowercase()),
            "docs/troubleshooting.md has no section for the condition reason {}",
            c.reason()
        );
    }
    for r in route_controller::warnings::Reason::ALL {
        assert!(
            page.contains(&format!("| `{}` |", r.as_str())),
            "docs/troubleshooting.md's Warning table lacks {}",
            r.as_str()
        );
    }
    for file in [
        "deploy/monitoring/alerts.rules.yaml",
        "deploy/monitoring/prometheusrule.yaml",
    ] {
        let rules = std::fs::read_to_string(root().join(file)).expect("read the rules");
        let mut alerts = 0;
        for alert in rules
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- alert: "))
        {
            alerts += 1;
            let url = format!(
                "runbook_url: https://github.com/cloud-route-controller/cloud-route-controller/blob/main/docs/troubleshooting.md#{}",
                alert.to_lowercase()
            );
            assert!(rules.contains(&url), "{file}: {alert} lacks {url}");
            assert!(
                headings.contains(&alert.to_lowercase()),
                "docs/troubleshooting.md has no section for {alert}"
            );
        }
        assert!(alerts >= 9, "{file}: {alerts} alerts");
    }
    for link in page.split("](#").skip(1) {
        let anchor = link.split(')').next().unwrap_or("");
        assert!(
            headings.iter().any(|h| h == anchor),
            "docs/troubleshooting.md links to #{anchor}, which is no heading"
        );
    }
}

/// The Markdown files under `dir` (relative to the repository).
fn markdown_in(dir: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join(dir))
        .expect("the docs directory")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            format!(
                "{dir}/{}",
                p.file_name().unwrap_or_default().to_string_lossy()
            )
        })
        .collect();
    out.sort();
    out
}

/// Every relative Markdown link of README.md, CONTRIBUTING.md and docs/
/// lands on a file, and on a heading of it when it names one.
#[test]
fn every_relative_link_of_the_docs_lands_on_a_file_and_heading() {
    let mut docs: Vec<String> = [
        "README.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "SECURITY.md",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    docs.extend(markdown_in("docs"));
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(root().join(doc)).expect("read the doc");
        let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
        for link in text.split("](").skip(1) {
            let target = link.split(')').next().unwrap_or("");
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                root().join(doc)
            } else {
                root().join(dir).join(file)
            };
            if !path.exists() {
                broken.push(format!("{doc}: {target} (no such file)"));
                continue;
            }
            if !anchor.is_empty() && path.extension().is_some_and(|x| x == "md") {
                let linked = std::fs::read_to_string(&path).expect("read the linked doc");
                if !anchors(&linked).iter().any(|a| a == anchor) {
                    broken.push(format!("{doc}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The `memory` cloud is the `lab` feature's, off in a release build: the
/// pages that list it among the clouds say so rather than calling it shipped.
#[test]
fn the_pages_say_the_memory_cloud_is_in_the_lab_build_only() {
    let cargo = std::fs::read_to_string(root().join("crates/cloud-route-controller/Cargo.toml"))
        .expect("read Cargo.toml");
    let default = cargo
        .lines()
        .find(|l| l.starts_with("default = "))
        .expect("default features");
    assert!(!default.contains("lab"), "{default}");
    for (page, marker) in [
        ("README.md", "| `memory` |"),
        ("docs/architecture.md", "| `crates/provider-memory` |"),
        ("docs/flags.md", "| `--cloud-provider` |"),
    ] {
        let text = std::fs::read_to_string(root().join(page)).expect(page);
        let row = text
            .lines()
            .find(|l| l.starts_with(marker))
            .unwrap_or_else(|| panic!("{page} has no row {marker}"));
        assert!(
            row.contains("lab build only") && row.contains("release image"),
            "{page}: {row}"
        );
        assert!(!row.contains("Always built"), "{page}: {row}");
    }
}

/// A provider's route limit as its source states it: the number after
/// `pub const <name>: usize = ` in `file`.
fn source_limit(file: &str, name: &str) -> u64 {
    let text = std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("pub const {name}: usize = ")))
        .and_then(|v| v.trim_end_matches(';').parse().ok())
        .unwrap_or_else(|| panic!("{file} has no {name}"))
}

/// The numbers a text part gives as a route limit: `N per <unit>` (and
/// `N routes per <unit>`), `N-route`, and `` `<key>` (N ``.
fn stated_limits(part: &str, units: &[&str], key: &str) -> Vec<u64> {
    let number = |w: &str| -> Option<u64> {
        let w = w.trim_matches(|c: char| !c.is_ascii_digit());
        (!w.is_empty() && w.chars().all(|c| c.is_ascii_digit() || c == ','))
            .then(|| w.replace(',', "").parse().ok())
            .flatten()
    };
    let words: Vec<&str> = part.split_whitespace().collect();
    let mut said = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if let Some(n) = w.strip_suffix("-route").and_then(number) {
            said.push(n);
        }
        let next = words.get(i + 1).copied().unwrap_or("");
        if *w == "per" && i >= 1 && units.iter().any(|u| next.starts_with(u)) {
            let before = if words[i - 1] == "routes" && i >= 2 {
                words[i - 2]
            } else {
                words[i - 1]
            };
            said.extend(number(before));
        } else if *w == format!("`{key}`") && next.starts_with('(') {
            said.extend(number(next));
        }
    }
    said
}

/// Every route limit the pages state for a cloud is the number its provider
/// uses (Azure's default `maxRoutes`, GCE's default `max_routes`, Hetzner's
/// fixed 100 per network), so a limit changed in one place and not in
/// another fails here: each number lives in the provider's source.
#[test]
fn every_route_limit_the_pages_state_is_the_providers_own() {
    struct Limit {
        cloud: &'static str,
        /// Words that put a text part about this cloud.
        about: &'static [&'static str],
        units: &'static [&'static str],
        key: &'static str,
        limit: u64,
        least: usize,
    }
    let limits = [
        Limit {
            cloud: "Azure",
            about: &["Azure", "maxRoutes"],
            units: &["table", "route"],
            key: "maxRoutes",
            limit: source_limit("crates/provider-azure/src/config.rs", "DEFAULT_MAX_ROUTES"),
            least: 3,
        },
        Limit {
            cloud: "GCE",
            about: &["GCE", "Compute Engine"],
            units: &["network", "project"],
            key: "max_routes",
            limit: source_limit("crates/provider-gce/src/config.rs", "DEFAULT_MAX_ROUTES"),
            least: 1,
        },
        Limit {
            cloud: "Hetzner",
            about: &["Hetzner", "hcloud"],
            units: &["network"],
            key: "max_routes",
            limit: source_limit(
                "crates/provider-hcloud/src/lib.rs",
                "MAX_ROUTES_PER_NETWORK",
            ),
            least: 2,
        },
    ];
    let mut pages = markdown_in("docs");
    pages.push("README.md".into());
    for l in &limits {
        let mut seen = 0;
        for page in &pages {
            let text = std::fs::read_to_string(root().join(page)).expect("read page");
            for line in text.lines() {
                for part in line.split(['|', ';']) {
                    if !l.about.iter().any(|a| part.contains(a)) {
                        continue;
                    }
                    for n in stated_limits(part, l.units, l.key) {
                        seen += 1;
                        assert_eq!(n, l.limit, "{page}: {} limit in {part:?}", l.cloud);
                    }
                }
            }
        }
        assert!(
            seen >= l.least,
            "the pages give {}'s limit {seen} times",
            l.cloud
        );
    }
}

/// Pins that the limit check reads what pages say.
#[test]
fn stated_limits_reads_each_way_a_page_says_a_limit() {
    assert_eq!(
        stated_limits("Azure 1,000 per table", &["table"], "maxRoutes"),
        [1000]
    );
    assert_eq!(
        stated_limits("Azure: 400 routes per table", &["table"], "maxRoutes"),
        [400]
    );
    assert_eq!(
        stated_limits(
            "GCE: `max_routes` (300, the quota)",
            &["network"],
            "max_routes"
        ),
        [300]
    );
    assert_eq!(
        stated_limits(
            "the network's 100-route limit, on Hetzner",
            &["network"],
            "x"
        ),
        [100]
    );
    assert!(stated_limits("Hetzner: one network", &["network"], "x").is_empty());
}

/// docs/deploying.md's RBAC table says both what the controller writes
/// with `nodes/status` patch and what the permission allows: Kubernetes
/// RBAC cannot narrow it to the one condition.
#[test]
fn the_rbac_table_says_nodes_status_patch_allows_every_status_field() {
    let text = std::fs::read_to_string(root().join("docs/deploying.md")).expect("deploying.md");
    let row = text
        .lines()
        .find(|l| l.starts_with("| ClusterRole |"))
        .expect("the ClusterRole row");
    assert!(
        row.contains("writes the NetworkUnavailable condition only")
            && row.contains("every status field"),
        "{row}"
    );
}
