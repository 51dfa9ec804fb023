//! The parts of the Hetzner Cloud API's JSON the provider reads and writes.
//!
//! Only the fields routing needs are declared; unknown fields are ignored so
//! additions to the API never break the client.

use serde::{Deserialize, Serialize};

/// `GET /networks/{id}`.
#[derive(Debug, Deserialize)]
pub(crate) struct NetworkEnvelope {
    pub network: Network,
}

/// `GET /networks?name=`.
#[derive(Debug, Deserialize)]
pub(crate) struct NetworksEnvelope {
    pub networks: Vec<Network>,
}

/// A private network.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Network {
    pub id: u64,
    #[serde(default)]
    pub ip_range: String,
    #[serde(default)]
    pub routes: Vec<NetworkRoute>,
}

/// One route of a network; also the body of `add_route` and `delete_route`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NetworkRoute {
    pub destination: String,
    pub gateway: String,
}

/// The answer of an action call and of `GET /actions/{id}`.
#[derive(Debug, Deserialize)]
pub(crate) struct ActionEnvelope {
    pub action: Action,
}

/// An asynchronous action.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Action {
    pub id: u64,
    /// `running`, `success` or `error`.
    pub status: String,
    #[serde(default)]
    pub error: Option<ApiError>,
}

/// `GET /servers`.
#[derive(Debug, Deserialize)]
pub(crate) struct ServersEnvelope {
    pub servers: Vec<Server>,
    #[serde(default)]
    pub meta: Option<Meta>,
}

/// A server and its private network attachments.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Server {
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub private_net: Vec<PrivateNet>,
}

/// A server's attachment to one private network.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PrivateNet {
    pub network: u64,
    pub ip: String,
}

/// Pagination of list calls.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Meta {
    #[serde(default)]
    pub pagination: Option<Pagination>,
}

/// Where a page lies in a list.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Pagination {
    #[serde(default)]
    pub next_page: Option<u64>,
}

/// An error answer: `{"error": {...}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorEnvelope {
    pub error: ApiError,
}

/// An API error (of a request or of a failed action).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ApiError {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}
