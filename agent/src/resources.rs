//! The agent's side of the resource guard: confine the process at start, take the GPU
//! readings (polled by the `gpu` worker) into the governor, export reservation, usage and
//! budgets to status and metrics.
//!
//! Metrics: `shoal_resources_{reserved_cores,memory_limit_bytes,memory_used_bytes,
//! memory_peak_bytes,cpu_usage_seconds}`, `shoal_gpu_{count,utilization_percent}`,
//! `shoal_background_budget_factor`, `shoal_background_budget_bytes_per_second{class}`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shoal_agent_api::{BackgroundBudget, GpuStatus, ResourceStatus};
use shoal_resource_guard::{
    AppliedGuard, Governor, GovernorConfig, GpuProbe, GpuSample, MachineInventory, NvmlProbe,
    ResourcesConfig, WorkClass,
};
use tracing::{info, warn};

use crate::AgentError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Clone, Default)]
struct Gauges {
    reserved_cores: Gauge<f64, std::sync::atomic::AtomicU64>,
    memory_limit: Gauge,
    memory_used: Gauge,
    memory_peak: Gauge,
    cpu_usage_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    gpu_count: Gauge,
    gpu_utilization: Gauge<f64, std::sync::atomic::AtomicU64>,
    background_factor: Gauge<f64, std::sync::atomic::AtomicU64>,
    budget: Family<ClassLabel, Gauge>,
}

/// Reservation, GPU view and background budget of this node.
pub struct Resources {
    /// The reservation in force (None: no `[resources]` section).
    pub guard: Option<AppliedGuard>,
    /// Background-work budget, fed by the GPU poller.
    pub governor: Arc<Mutex<Governor>>,
    /// Latest GPU reading.
    pub gpu: Arc<Mutex<GpuSample>>,
    gauges: Gauges,
}

/// The environment variable of [`Resources::gpu_probe`]'s fake GPU.
pub const FAKE_GPU_ENV: &str = "SHOAL_FAKE_GPU_UTILIZATION";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Resources {
    /// Confines this process per `config` (refusing an impossible or unenforceable
    /// reservation) and starts the GPU poller.
    pub fn start(
        config: Option<&ResourcesConfig>,
        background: &crate::config::BackgroundConfig,
        registry: &mut Registry,
    ) -> Result<Arc<Self>, AgentError> {
        let (rate, repair_floor) = background.rates()?;
        let guard = match config {
            Some(c) => {
                let machine = MachineInventory::probe()?;
                Some(shoal_resource_guard::apply(
                    c,
                    &machine,
                    shoal_resource_guard::detect(),
                    std::process::id(),
                )?)
            }
            None => {
                warn!("no [resources] section: the agent is NOT confined to a reservation");
                None
            }
        };
        let gauges = register(registry);
        if let Some(g) = &guard {
            let r = g.reservation();
            gauges.reserved_cores.set(r.cores);
            gauges.memory_limit.set(r.memory_bytes as i64);
        }
        let resources = Arc::new(Resources {
            guard,
            governor: Arc::new(Mutex::new(Governor::new(
                GovernorConfig {
                    idle_bytes_per_sec: rate,
                    last_parity_floor_bytes_per_sec: repair_floor,
                    ..GovernorConfig::default()
                },
                tokio::time::Instant::now().into_std(),
            ))),
            gpu: Arc::new(Mutex::new(GpuSample::default())),
            gauges,
        });
        Ok(resources)
    }

    /// The node's GPUs, for the `gpu` worker to poll.
    /// `SHOAL_FAKE_GPU_UTILIZATION` (a percent) replaces NVML with one busy fake GPU, for
    /// benchmarks of background work under a training load on machines without GPUs.
    pub fn gpu_probe() -> Box<dyn GpuProbe> {
        match std::env::var(FAKE_GPU_ENV).ok().map(|v| v.parse::<f64>()) {
            Some(Ok(percent)) if (0.0..=100.0).contains(&percent) => {
                warn!(
                    percent,
                    "{FAKE_GPU_ENV} is set: a FAKE GPU at this utilisation sizes background work"
                );
                let fake = shoal_resource_guard::FakeGpu::default();
                fake.set(GpuSample {
                    count: 1,
                    utilization_percent: Some(percent),
                    ..GpuSample::default()
                });
                Box::new(fake)
            }
            Some(_) => {
                warn!("{FAKE_GPU_ENV} is not a percent (0 to 100): ignored, NVML is used");
                Box::new(NvmlProbe::init())
            }
            None => Box::new(NvmlProbe::init()),
        }
    }

    /// Takes a GPU reading: the governor's budget follows it.
    pub fn observe(&self, sample: GpuSample) {
        lock(&self.governor).observe(&sample, tokio::time::Instant::now().into_std());
        *lock(&self.gpu) = sample;
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let g = &self.gauges;
        if let Some(u) = self.guard.as_ref().and_then(AppliedGuard::usage) {
            g.memory_used.set(u.memory_bytes as i64);
            g.memory_peak.set(u.memory_peak_bytes as i64);
            g.cpu_usage_seconds.set(u.cpu_usage_usec as f64 / 1e6);
        }
        let gpu = lock(&self.gpu).clone();
        g.gpu_count.set(gpu.count as i64);
        g.gpu_utilization
            .set(gpu.utilization_percent.unwrap_or(0.0));
        let gov = lock(&self.governor);
        g.background_factor.set(gov.factor());
        for class in WorkClass::ALL {
            g.budget
                .get_or_create(&ClassLabel {
                    class: class.name(),
                })
                .set(gov.budget(class).bytes_per_sec as i64);
        }
    }

    /// Status view of the reservation.
    pub fn status(&self) -> Option<ResourceStatus> {
        let g = self.guard.as_ref()?;
        let r = g.reservation();
        let usage = g.usage();
        Some(ResourceStatus {
            enforced: g.enforced(),
            note: g.unenforced_reason.clone(),
            cgroup: g.location(),
            cpus: r.cpus.as_ref().map(|c| c.to_string()),
            reserved_cores: r.cores,
            memory_limit_bytes: r.memory_bytes,
            training_cores: r.training_cores,
            training_memory_bytes: r.training_memory_bytes,
            memory_used_bytes: usage.map(|u| u.memory_bytes),
            memory_peak_bytes: usage.map(|u| u.memory_peak_bytes),
            cpu_usage_seconds: usage.map(|u| u.cpu_usage_usec as f64 / 1e6),
        })
    }

    pub fn gpu_status(&self) -> GpuStatus {
        let s = lock(&self.gpu).clone();
        GpuStatus {
            count: s.count,
            utilization_percent: s.utilization_percent,
            memory_used_bytes: s.memory_used_bytes,
            memory_total_bytes: s.memory_total_bytes,
            note: s.unavailable,
        }
    }

    /// Asks the governor for `bytes` of `class` work now; `Err` says how long to wait.
    /// `urgent` (repair of a stripe at its last spare shard) also draws on the floor that
    /// busy GPUs never shrink.
    pub fn take(&self, class: WorkClass, bytes: u64, urgent: bool) -> Result<(), Duration> {
        let mut gov = lock(&self.governor);
        if urgent && class == WorkClass::Repair {
            gov.take_last_parity_repair(bytes, tokio::time::Instant::now().into_std())
        } else {
            gov.take(class, bytes, tokio::time::Instant::now().into_std())
        }
    }

    /// What `class` may use now.
    pub fn budget(&self, class: WorkClass) -> shoal_resource_guard::Budget {
        lock(&self.governor).budget(class)
    }

    pub fn background(&self) -> (f64, Vec<BackgroundBudget>) {
        let gov = lock(&self.governor);
        let budgets = WorkClass::ALL
            .iter()
            .map(|c| {
                let b = gov.budget(*c);
                BackgroundBudget {
                    class: c.name().to_owned(),
                    bytes_per_sec: b.bytes_per_sec,
                    concurrency: b.concurrency,
                }
            })
            .collect();
        (gov.factor(), budgets)
    }

    /// Leaves the cgroup (moving back to the parent and removing it).
    pub fn shutdown(&self) {
        if let Some(g) = &self.guard {
            match g.release() {
                Ok(true) => info!("left and removed the agent's cgroup"),
                Ok(false) => info!(
                    "left the agent's cgroup; it stays for the processes still in it (mounts), which the next agent takes over"
                ),
                Err(e) => warn!(error = %e, "could not leave the agent's cgroup"),
            }
        }
    }
}

fn register(registry: &mut Registry) -> Gauges {
    let g = Gauges::default();
    let r = registry.sub_registry_with_prefix("shoal_resources");
    r.register(
        "reserved_cores",
        "CPU cores reserved for the agent",
        g.reserved_cores.clone(),
    );
    r.register(
        "memory_limit_bytes",
        "Memory limit of the agent's cgroup",
        g.memory_limit.clone(),
    );
    r.register(
        "memory_used_bytes",
        "Memory the agent's cgroup uses now",
        g.memory_used.clone(),
    );
    r.register(
        "memory_peak_bytes",
        "Highest memory use of the agent's cgroup",
        g.memory_peak.clone(),
    );
    r.register(
        "cpu_usage_seconds",
        "CPU time used by the agent's cgroup",
        g.cpu_usage_seconds.clone(),
    );
    let r = registry.sub_registry_with_prefix("shoal_gpu");
    r.register(
        "count",
        "GPUs on this node (0 without NVML)",
        g.gpu_count.clone(),
    );
    r.register(
        "utilization_percent",
        "Mean GPU utilisation",
        g.gpu_utilization.clone(),
    );
    let r = registry.sub_registry_with_prefix("shoal_background");
    r.register(
        "budget_factor",
        "Fraction of the idle background budget in force",
        g.background_factor.clone(),
    );
    r.register(
        "budget_bytes_per_second",
        "Background budget per class of work",
        g.budget.clone(),
    );
    g
}
