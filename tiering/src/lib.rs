//! shoal's cold tier: the object-store seam ([`ColdStore`]) with its implementations (an
//! S3-compatible bucket and a local directory through `object_store`, and [`Faulty`] for
//! tests), the layout of packed objects ([`pack`]) and the pure tiering policy
//! ([`policy`]). The mover and recall live in the agent and use the trait.

mod backend;
pub mod contract;
mod error;
mod faulty;
pub mod pack;
pub mod policy;
mod store;

pub use backend::{ObjectBackend, S3Settings};
pub use error::TierError;
pub use faulty::Faulty;
pub use store::ColdStore;
