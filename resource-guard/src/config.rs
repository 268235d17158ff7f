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

impl ResourcesConfig {
    /// The cores this reservation gives the agent, as far as the config alone says: a
    /// cpuset's size, or the quota. `None` where it names neither, both, or an unreadable
    /// list: the guard refuses those at start, saying why.
    pub fn cores(&self) -> Option<f64> {
        match (&self.cpus, self.cpu_cores) {
            (Some(text), None) => crate::CpuList::parse(text)
                .filter(|l| !l.is_empty())
                .map(|l| l.len() as f64),
            (None, Some(c)) if c.is_finite() && c > 0.0 => Some(c),
            _ => None,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reserving(cpus: Option<&str>, cpu_cores: Option<f64>) -> ResourcesConfig {
        ResourcesConfig {
            cpus: cpus.map(str::to_owned),
            cpu_cores,
            memory: "1GiB".into(),
            min_free_cores: default_min_free_cores(),
            min_free_memory: default_min_free_memory(),
            cgroup: default_cgroup(),
            enforcement: default_enforcement(),
        }
    }

    #[test]
    fn the_reserved_cores_are_the_cpuset_size_or_the_quota() {
        assert_eq!(reserving(Some("0-3,6"), None).cores(), Some(5.0));
        assert_eq!(reserving(None, Some(2.5)).cores(), Some(2.5));
        assert_eq!(reserving(None, None).cores(), None, "neither");
        assert_eq!(reserving(Some("0-1"), Some(2.0)).cores(), None, "both");
        assert_eq!(reserving(Some("two"), None).cores(), None, "unreadable");
        assert_eq!(reserving(Some(""), None).cores(), None, "empty");
        assert_eq!(reserving(None, Some(0.0)).cores(), None, "no time");
        assert_eq!(
            reserving(None, Some(f64::NAN)).cores(),
            None,
            "not a number"
        );
    }
}
