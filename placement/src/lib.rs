//! Where shards belong. This crate owns the cluster layout (nodes, failure domains,
//! weights, states, epoch), the erasure-coding profile (`k+m`), the geometry of a stripe
//! (how its bytes are cut into shards) and the placement function
//! `(layout, stripe id, profile) -> ordered targets`, by weighted rendezvous hashing with
//! failure-domain spreading; and how well a stripe is spread ([`Spread`]), which no drain
//! or rebalance move may make worse ([`place_moves`]). A node's layout weight is the size
//! of its data dir's filesystem (`capacity_bytes` from its gossiped facts; the steward
//! sets it). Property tests: `tests/placement_properties.rs`,
//! `tests/geometry_properties.rs`.
//!
//! Read first: [`place`], [`Layout`], [`StripeGeometry`]. The hash behind `place` is
//! part of the on-disk contract (it decides where data lives): see the `hash` module.
//!
//! Pure: no tokio, no filesystem, no clock, no randomness of its own — only `serde` and
//! `thiserror`. A CI check fails if `cargo tree -e normal` shows an I/O crate here.
#![forbid(unsafe_code)]

mod error;
mod geometry;
mod hash;
mod layout;
mod profile;
mod rendezvous;
mod spread;

pub use error::PlacementError;
pub use geometry::{DEFAULT_SHARD_SIZE, SHARD_ALIGN, ShardSlice, StripeGeometry};
pub use layout::{FailureDomain, Layout, LayoutNode, NodeState};
pub use profile::{EcProfile, MAX_SHARDS};
pub use rendezvous::{place, place_degraded, place_repair};
pub use shoal_ids::{NodeId, StripeId};
pub use spread::{Move, Spread, place_moves};
