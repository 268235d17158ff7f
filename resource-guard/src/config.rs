use serde::{Deserialize, Serialize};

/// What to do where the reservation cannot be enforced (no writable cgroup controllers,
/// as inside most containers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Enforcement {
    /// Refuse to start: the training job's share is only guaranteed if we are confined.
    Required,
    /// Say so loudly and run unconfined.
    BestEffort,
}

/// `[resources]`: the share of this node the storage side may use. The training job keeps
/// everything else.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourcesConfig {
    /// Cores reserved for the agent as a cpuset, e.g. "0-3". Give this or `cpu_cores`.
    #[serde(default)]
    pub cpus: Option<String>,
    /// CPU time reserved as a quota in cores, e.g. 2.5. Give this or `cpus`.
    #[serde(default)]
    pub cpu_cores: Option<f64>,
    /// Memory limit of the agent (and its mounts), e.g. "8GiB".
    pub memory: String,
    /// Cores that must stay free for training; a reservation leaving fewer is refused.
    #[serde(default = "default_min_free_cores")]
    pub min_free_cores: f64,
    /// Memory that must stay free for training, e.g. "16GiB".
    #[serde(default = "default_min_free_memory")]
    pub min_free_memory: String,
    /// Name of the agent's cgroup, created under the cgroup the agent was started in.
    #[serde(default = "default_cgroup")]
    pub cgroup: String,
    /// `required` (default) or `best-effort`.
    #[serde(default = "default_enforcement")]
    pub enforcement: Enforcement,
}

fn default_min_free_cores() -> f64 {
    1.0
}
fn default_min_free_memory() -> String {
    "1GiB".into()
}
fn default_cgroup() -> String {
    "shoal".into()
}
fn default_enforcement() -> Enforcement {
    Enforcement::Required
}
