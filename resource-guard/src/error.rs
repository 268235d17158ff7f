/// Everything the resource guard can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// A `[resources]` value is impossible on its own or on this machine; `key` is its full
    /// TOML path and the message gives the machine's actual figure where one applies.
    #[error("config key {key}: {reason}")]
    Config { key: &'static str, reason: String },
    /// The machine's CPUs or memory could not be read.
    #[error("cannot read machine inventory from {source_path}: {reason}")]
    Inventory { source_path: String, reason: String },
    /// A cgroup operation failed.
    #[error("cgroup {group}: {reason}")]
    Cgroup { group: String, reason: String },
    /// A cgroup with our name exists and holds a live process that is not us.
    #[error(
        "cgroup {group} is in use by pid {pid} (another agent with the same [resources] cgroup name?)"
    )]
    CgroupBusy { group: String, pid: u32 },
    /// This machine offers no cgroup controller we can write (e.g. inside a container).
    #[error("cannot enforce the reservation here: {0}")]
    Unenforceable(String),
}

impl GuardError {
    pub(crate) fn cgroup(group: &str, reason: impl ToString) -> Self {
        GuardError::Cgroup {
            group: group.to_owned(),
            reason: reason.to_string(),
        }
    }
}
