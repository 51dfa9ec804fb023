//! Pure decision logic of cloud-route-controller.
//!
//! This crate owns no state and does no I/O: no Kubernetes client, no cloud
//! SDK, no async runtime. It turns a snapshot of Nodes and cloud routes into a
//! [`Plan`] with [`plan()`]. The controller crate decides *when* to plan and
//! executes the plan; providers translate routes to and from their cloud.
//!
//! The rules follow the route controller of `k8s.io/cloud-provider`
//! (`controllers/route`), with the corrections listed on [`planner`].

pub mod check;
pub mod cidr;
pub mod model;
pub mod plan;
pub mod planner;
pub mod text;

pub use check::{Misconfiguration, check_configuration};
pub use cidr::{Cidr, CidrError, IpFamily};
pub use model::{
    ConditionState, Destination, NodeAddress, NodeView, PodCidr, Route, parse_cluster_cidrs,
};
pub use plan::{
    AwaitingNodeData, Conflict, Creation, CreationReason, Deletion, DeletionReason, InvalidPodCidr,
    MissingNodeData, NetworkCondition, NodePlan, OpKey, OutsideCidr, Overlap, Plan, PlanConfig,
    TargetNeeds,
};
pub use planner::{is_responsible_for_route, plan, routable_pod_cidr, same_addresses};
pub use text::Text;
