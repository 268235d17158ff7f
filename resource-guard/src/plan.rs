//! The pure reservation plan: config + machine inventory → cgroup limits, or a refusal that
//! names the key and the machine's actual figure.

use crate::cgroup::CgroupLimits;
use shoal_units::{format_size, parse_size};

use crate::{CpuList, GuardError, MachineInventory, ResourcesConfig};

/// CFS period used for a CPU quota.
const CFS_PERIOD_US: u64 = 100_000;

/// What the agent reserves and what that leaves for training.
#[derive(Clone, Debug, PartialEq)]
pub struct Reservation {
    /// Reserved cores as a cpuset, when given.
    pub cpus: Option<CpuList>,
    /// Reserved CPU time in cores (the cpuset's size, or the quota).
    pub cores: f64,
    pub memory_bytes: u64,
    pub training_cores: f64,
    pub training_memory_bytes: u64,
    /// Name of the agent's cgroup.
    pub cgroup: String,
}

impl Reservation {
    /// The cgroup limits that enforce this reservation.
    pub fn limits(&self, inventory_mems: Option<&str>) -> CgroupLimits {
        CgroupLimits {
            cpus: self.cpus.as_ref().map(|c| c.to_string()),
            mems: self
                .cpus
                .as_ref()
                .map(|_| inventory_mems.unwrap_or("0").to_owned()),
            cpu_quota: match self.cpus {
                Some(_) => None,
                None => Some((
                    (self.cores * CFS_PERIOD_US as f64).round() as i64,
                    CFS_PERIOD_US,
                )),
            },
            memory_max: Some(self.memory_bytes),
        }
    }
}

fn invalid(key: &'static str, reason: String) -> GuardError {
    GuardError::Config { key, reason }
}

/// Checks `config` against `machine` and computes the reservation.
pub fn plan(
    config: &ResourcesConfig,
    machine: &MachineInventory,
) -> Result<Reservation, GuardError> {
    let (cpus, cores) = plan_cpu(config, machine)?;
    let memory_bytes = plan_memory(config, machine)?;
    let (training_cores, training_memory_bytes) =
        check_training_floor(config, machine, cores, memory_bytes)?;
    let cgroup = check_cgroup_name(&config.cgroup)?;
    Ok(Reservation {
        cpus,
        cores,
        memory_bytes,
        training_cores,
        training_memory_bytes,
        cgroup,
    })
}

/// The reserved CPUs: a cpuset on this machine, or a quota of cores it has.
fn plan_cpu(
    config: &ResourcesConfig,
    machine: &MachineInventory,
) -> Result<(Option<CpuList>, f64), GuardError> {
    let machine_cores = machine.cpus.len() as f64;
    match (&config.cpus, config.cpu_cores) {
        (Some(_), Some(_)) => Err(invalid(
            "resources.cpu_cores",
            "give either resources.cpus (a cpuset) or resources.cpu_cores (a quota), not both"
                .into(),
        )),
        (None, None) => Err(invalid(
            "resources.cpus",
            "reserve CPU with resources.cpus (e.g. \"0-3\") or resources.cpu_cores (e.g. 2.5)"
                .into(),
        )),
        (Some(text), None) => {
            let list = CpuList::parse(text)
                .filter(|l| !l.is_empty())
                .ok_or_else(|| {
                    invalid(
                        "resources.cpus",
                        format!("{text:?} is not a CPU list such as \"0-3,6\""),
                    )
                })?;
            if let Some(absent) = list.0.iter().find(|c| !machine.cpus.0.contains(c)) {
                return Err(invalid(
                    "resources.cpus",
                    format!(
                        "CPU {absent} is not on this machine (online CPUs: {})",
                        machine.cpus
                    ),
                ));
            }
            let n = list.len() as f64;
            Ok((Some(list), n))
        }
        (None, Some(cores)) => {
            if !(cores.is_finite() && cores >= 0.01) {
                return Err(invalid(
                    "resources.cpu_cores",
                    format!("{cores} must be at least 0.01"),
                ));
            }
            if cores > machine_cores {
                return Err(invalid(
                    "resources.cpu_cores",
                    format!("{cores} is more than this machine's {machine_cores} cores"),
                ));
            }
            Ok((None, cores))
        }
    }
}

/// The reserved memory: at least 64 MiB, at most what the machine has.
fn plan_memory(config: &ResourcesConfig, machine: &MachineInventory) -> Result<u64, GuardError> {
    let memory_bytes =
        parse_size(&config.memory).map_err(|e| invalid("resources.memory", e.to_string()))?;
    if memory_bytes < 64 << 20 {
        return Err(invalid(
            "resources.memory",
            format!("{:?} is less than 64MiB", config.memory),
        ));
    }
    if memory_bytes > machine.memory_bytes {
        return Err(invalid(
            "resources.memory",
            format!(
                "{} is more than this machine's {}",
                format_size(memory_bytes),
                format_size(machine.memory_bytes)
            ),
        ));
    }
    Ok(memory_bytes)
}

/// What the training job keeps (cores, memory), refused below the configured floors.
fn check_training_floor(
    config: &ResourcesConfig,
    machine: &MachineInventory,
    cores: f64,
    memory_bytes: u64,
) -> Result<(f64, u64), GuardError> {
    let machine_cores = machine.cpus.len() as f64;
    if !(config.min_free_cores.is_finite() && config.min_free_cores >= 0.0) {
        return Err(invalid(
            "resources.min_free_cores",
            "must be 0 or more".into(),
        ));
    }
    let min_free_memory = parse_size(&config.min_free_memory)
        .map_err(|e| invalid("resources.min_free_memory", e.to_string()))?;
    let training_cores = machine_cores - cores;
    if training_cores < config.min_free_cores {
        return Err(invalid(
            "resources.min_free_cores",
            format!(
                "reserving {cores} of this machine's {machine_cores} cores leaves {training_cores} for training, below the floor of {}",
                config.min_free_cores
            ),
        ));
    }
    let training_memory_bytes = machine.memory_bytes - memory_bytes;
    if training_memory_bytes < min_free_memory {
        return Err(invalid(
            "resources.min_free_memory",
            format!(
                "reserving {} of this machine's {} leaves {} for training, below the floor of {}",
                format_size(memory_bytes),
                format_size(machine.memory_bytes),
                format_size(training_memory_bytes),
                format_size(min_free_memory)
            ),
        ));
    }
    Ok((training_cores, training_memory_bytes))
}

/// The cgroup's name: a plain name, never a path.
fn check_cgroup_name(name: &str) -> Result<String, GuardError> {
    if name.is_empty()
        || name.len() > 200
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || name.starts_with('.')
    {
        return Err(invalid(
            "resources.cgroup",
            format!("{name:?} must be a plain name of letters, digits, '-', '_' and '.'"),
        ));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Enforcement;

    use crate::inventory::test_machine as machine;

    fn config() -> ResourcesConfig {
        ResourcesConfig {
            cpus: Some("0-1".into()),
            cpu_cores: None,
            memory: "8GiB".into(),
            min_free_cores: 4.0,
            min_free_memory: "32GiB".into(),
            cgroup: "shoal".into(),
            enforcement: Enforcement::Required,
        }
    }

    fn refused_key(c: &ResourcesConfig) -> (&'static str, String) {
        match plan(c, &machine()) {
            Err(GuardError::Config { key, reason }) => (key, reason),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn cpuset_reservation_leaves_the_rest_to_training() {
        let r = plan(&config(), &machine()).expect("plan");
        assert_eq!(r.cores, 2.0);
        assert_eq!(r.training_cores, 6.0);
        assert_eq!(r.training_memory_bytes, 56 << 30);
        let limits = r.limits(Some("0"));
        assert_eq!(limits.cpus.as_deref(), Some("0-1"));
        assert_eq!(limits.cpu_quota, None);
        assert_eq!(limits.memory_max, Some(8 << 30));
    }

    #[test]
    fn quota_reservation_becomes_cfs_quota() {
        let mut c = config();
        c.cpus = None;
        c.cpu_cores = Some(2.5);
        let r = plan(&c, &machine()).expect("plan");
        assert_eq!(r.limits(None).cpu_quota, Some((250_000, 100_000)));
        assert_eq!(r.limits(None).cpus, None);
    }

    #[test]
    fn absent_cpu_is_refused_naming_the_online_cpus() {
        let mut c = config();
        c.cpus = Some("6-9".into());
        let (key, reason) = refused_key(&c);
        assert_eq!(key, "resources.cpus");
        assert!(
            reason.contains("CPU 8") && reason.contains("0-7"),
            "{reason}"
        );
    }

    #[test]
    fn more_memory_than_the_machine_is_refused_with_its_figure() {
        let mut c = config();
        c.memory = "128GiB".into();
        let (key, reason) = refused_key(&c);
        assert_eq!(key, "resources.memory");
        assert!(reason.contains("64.0GiB"), "{reason}");
    }

    #[test]
    fn reservation_below_the_training_floor_is_refused() {
        let mut c = config();
        c.cpus = Some("0-5".into());
        assert_eq!(refused_key(&c).0, "resources.min_free_cores");
        let mut c = config();
        c.memory = "40GiB".into();
        assert_eq!(refused_key(&c).0, "resources.min_free_memory");
        let mut c = config();
        c.cpus = None;
        c.cpu_cores = Some(9.0);
        assert_eq!(refused_key(&c).0, "resources.cpu_cores");
    }

    #[test]
    fn cpu_must_be_given_exactly_one_way() {
        let mut c = config();
        c.cpu_cores = Some(1.0);
        assert_eq!(refused_key(&c).0, "resources.cpu_cores");
        let mut c = config();
        c.cpus = None;
        assert_eq!(refused_key(&c).0, "resources.cpus");
    }

    #[test]
    fn bad_sizes_and_names_are_refused() {
        let mut c = config();
        c.memory = "lots".into();
        let (key, reason) = refused_key(&c);
        assert_eq!(key, "resources.memory");
        assert!(reason.contains("\"lots\" is not a size"), "{reason}");
        c.memory = "32MiB".into();
        assert_eq!(refused_key(&c).0, "resources.memory");
        let mut c = config();
        c.cgroup = "../escape".into();
        assert_eq!(refused_key(&c).0, "resources.cgroup");
        let mut c = config();
        c.min_free_memory = "x".into();
        assert_eq!(refused_key(&c).0, "resources.min_free_memory");
    }
}
