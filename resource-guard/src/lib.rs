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
//! `[resources]` keys: `cpus` (a cpuset) or `cpu_cores` (a CFS quota), `memory`,
//! `min_free_cores`, `min_free_memory`, `cgroup` (the group's name, default `shoal`),
//! `enforcement` (`required` | `best-effort`). Without the section the agent runs
//! unconfined, which it logs as a warning and status shows.
//!
//! At start, before anything but the certificate and node id, the agent plans against
//! [`MachineInventory::probe`], replaces a stale group of the same name ([`apply`]: refused
//! while another live agent holds it; its other members, mounts, move into the new group
//! with the agent), creates the group below the cgroup it was started in (per hierarchy on
//! v1; under systemd `Delegate=yes` on v2) and moves itself in. A clean stop moves the
//! agent back to the parent and removes the group, or leaves it to the mounts still in it
//! for the next agent to take over ([`CgroupFs::leave`]). Known gaps: between an agent's
//! stop and the next agent's start the mounts are in a group without limits on v2 (on v1
//! the group keeps its limits); v1 does not move already-charged memory with the process
//! (`memory.move_charge_at_immigrate` is not set), so pages the agent touched before
//! joining stay charged to the parent.
//!
//! GPU: the agent's `gpu` worker polls NVML every 2 s on the blocking pool ([`NvmlProbe`];
//! a node without NVIDIA's library reports "no GPU (...)" and carries on);
//! `SHOAL_FAKE_GPU_UTILIZATION` replaces NVML with one fake GPU (benchmarks only; the agent
//! warns loudly).
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
