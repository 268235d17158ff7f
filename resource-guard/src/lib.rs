//! The resource guard: shoal is converged storage, so the agent must live inside a fixed
//! CPU/RAM reservation on each GPU server and yield background work while the GPUs are busy.
//!
//! Read first:
//! - [`ResourcesConfig`] → [`plan`] → [`Reservation`]: the pure reservation plan (config and
//!   machine inventory in, cgroup limits out, with validation that names the key and the
//!   machine's actual figure).
//! - [`CgroupFs`]: the seam to the kernel. [`CgroupV1`] goes through cgroups-rs;
//!   [`CgroupV2`] writes the v2 files itself (cgroups-rs enables controllers in an order a
//!   delegated service cgroup refuses); [`FakeCgroupV2`] models v2 in memory. One
//!   [`contract`] suite runs against all.
//! - [`Governor`]: pure token buckets that turn GPU utilisation into a budget for background
//!   work; [`GpuProbe`] (NVML, or a fake) feeds it.
//!
//! This crate must never depend on the mesh, storage or metadata crates.

pub mod cgroup;
mod config;
mod cpu_list;
mod error;
mod governor;
mod gpu;
mod guard;
mod inventory;
mod plan;

pub use cgroup::fake::FakeCgroupV2;
pub use cgroup::v1::CgroupV1;
pub use cgroup::v2::CgroupV2;
pub use cgroup::{CgroupFs, CgroupLimits, CgroupUsage, CgroupVersion, contract, detect};
pub use config::{Enforcement, ResourcesConfig};
pub use cpu_list::CpuList;
pub use error::GuardError;
pub use governor::{Budget, Governor, GovernorConfig, WorkClass};
pub use gpu::{FakeGpu, GpuProbe, GpuSample, NvmlProbe, no_gpu};
pub use guard::{AppliedGuard, apply};
pub use inventory::MachineInventory;
pub use plan::{Reservation, plan};
