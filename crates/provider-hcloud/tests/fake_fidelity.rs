//! Requests the fake once could not answer as the real API does, found by
//! running the official Go client (hcloud-go v2.52.0, through the upstream
//! baseline's `hcloudroutes` package) against it. Each test sends the request
//! exactly as hcloud-go builds it and is named after the fix.

use std::time::Duration;

use provider_hcloud::testing::{FakeConfig, FakeHcloud};
use serde_json::Value;

const NET: u64 = 7;

async fn fake() -> FakeHcloud {
    let fake = FakeHcloud::start(FakeConfig {
        action_duration: Duration::from_millis(1500),
        ..FakeConfig::default()
    })
    .await
    .expect("start the fake Hetzner API");
    fake.add_network(NET, "k8s", "10.0.0.0/8", &["10.0.0.0/24"]);
    for i in 0..120u64 {
        fake.add_server(
            100 + i,
            &format!("node-{i}"),
            NET,
            &format!("10.0.{}.{}", 1 + i / 250, i % 250 + 2),
        );
    }
    fake
}

async fn call(
    fake: &FakeHcloud,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", fake.base_url()))
        .bearer_auth(fake.token());
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.expect("the fake answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("a body");
    (status, serde_json::from_str(&text).expect("a JSON body"))
}

async fn get(fake: &FakeHcloud, path: &str) -> (u16, Value) {
    call(fake, reqwest::Method::GET, path, None).await
}

#[tokio::test]
async fn action_waiter_list_of_actions_by_id_is_served() {
    let fake = fake().await;
    let (status, created) = call(
        &fake,
        reqwest::Method::POST,
        &format!("/networks/{NET}/actions/add_route"),
        Some(serde_json::json!({"destination": "10.244.0.0/24", "gateway": "10.0.1.2"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["action"]["id"].as_u64().expect("an action id");
    // hcloud-go's ActionClient.WaitFor: up to 25 ids, sorted, paged.
    let path = format!("/actions?id={id}&id=999999&page=1&per_page=50&sort=status&sort=id");
    let (status, running) = get(&fake, &path).await;
    assert_eq!(status, 200, "{running}");
    let list = running["actions"].as_array().expect("an actions list");
    assert_eq!(list.len(), 1, "only the existing id is listed: {running}");
    assert_eq!(list[0]["id"].as_u64(), Some(id));
    assert_eq!(list[0]["status"], "running");
    assert_eq!(running["meta"]["pagination"]["total_entries"], 1);
    assert!(running["meta"]["pagination"]["next_page"].is_null());
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let (_, done) = get(&fake, &path).await;
    assert_eq!(done["actions"][0]["status"], "success", "{done}");
    assert_eq!(fake.count("list_actions"), 2);
    assert_eq!(fake.count("unknown"), 0);
}

#[tokio::test]
async fn server_list_by_name_is_filtered() {
    let fake = fake().await;
    // hcloud-go's ServerClient.GetByName lists with `name=` and takes the
    // first server: unfiltered, that was node-0 whatever the name.
    let (status, v) = get(&fake, "/servers?name=node-77").await;
    assert_eq!(status, 200, "{v}");
    let list = v["servers"].as_array().expect("a servers list");
    assert_eq!(list.len(), 1, "{v}");
    assert_eq!(list[0]["id"], 177);
    assert_eq!(list[0]["private_net"][0]["ip"], "10.0.1.79");
    let (_, none) = get(&fake, "/servers?name=nobody").await;
    assert_eq!(none["servers"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn server_get_by_id_is_served() {
    let fake = fake().await;
    let (status, v) = get(&fake, "/servers/105").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["server"]["name"], "node-5");
    assert_eq!(v["server"]["private_net"][0]["network"], NET);
    let (status, v) = get(&fake, "/servers/1").await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "not_found");
}

#[tokio::test]
async fn server_pages_of_fifty_end_with_a_null_next_page() {
    let fake = fake().await;
    // hcloud-go's ServerClient.All: per_page=50, pages until next_page is null.
    let mut seen = 0;
    let mut page = 1;
    loop {
        let (_, v) = get(&fake, &format!("/servers?page={page}&per_page=50")).await;
        seen += v["servers"].as_array().map_or(0, Vec::len);
        assert_eq!(v["meta"]["pagination"]["last_page"], 3);
        match v["meta"]["pagination"]["next_page"].as_u64() {
            Some(n) => page = n,
            None => break,
        }
    }
    assert_eq!((seen, page), (120, 3));
}
