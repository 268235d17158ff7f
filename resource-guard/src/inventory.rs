//! What the machine has: online CPUs and physical memory.

use crate::{CpuList, GuardError};

#[derive(Clone, Debug, PartialEq)]
pub struct MachineInventory {
    pub cpus: CpuList,
    pub memory_bytes: u64,
    /// Online NUMA memory nodes ("0", "0-1"), for cpusets.
    pub mems: String,
}

impl MachineInventory {
    /// Reads `/sys/devices/system/cpu/online`, `/proc/meminfo` and
    /// `/sys/devices/system/node/online` (memory node "0" when that is unreadable).
    pub fn probe() -> Result<Self, GuardError> {
        let online = "/sys/devices/system/cpu/online";
        let text = std::fs::read_to_string(online).map_err(|e| GuardError::Inventory {
            source_path: online.into(),
            reason: e.to_string(),
        })?;
        let cpus = CpuList::parse(&text).ok_or_else(|| GuardError::Inventory {
            source_path: online.into(),
            reason: format!("unreadable CPU list {text:?}"),
        })?;
        let meminfo = "/proc/meminfo";
        let text = std::fs::read_to_string(meminfo).map_err(|e| GuardError::Inventory {
            source_path: meminfo.into(),
            reason: e.to_string(),
        })?;
        let memory_bytes = parse_mem_total(&text).ok_or_else(|| GuardError::Inventory {
            source_path: meminfo.into(),
            reason: "no MemTotal line".into(),
        })?;
        let mems = std::fs::read_to_string("/sys/devices/system/node/online")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| CpuList::parse(s).is_some_and(|l| !l.is_empty()))
            .unwrap_or_else(|| "0".into());
        Ok(MachineInventory {
            cpus,
            memory_bytes,
            mems,
        })
    }
}

/// An 8-CPU, 64 GiB machine for unit tests.
#[cfg(test)]
pub(crate) fn test_machine() -> MachineInventory {
    MachineInventory {
        cpus: CpuList::parse("0-7").expect("cpus"),
        memory_bytes: 64 << 30,
        mems: "0".into(),
    }
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_kib() {
        assert_eq!(
            parse_mem_total("MemTotal:       16384 kB\nMemFree: 1 kB\n"),
            Some(16 << 20)
        );
        assert_eq!(parse_mem_total("nothing"), None);
    }

    #[test]
    fn this_machine_has_cpus_and_memory() {
        let inv = MachineInventory::probe().expect("probe");
        assert!(!inv.cpus.is_empty());
        assert!(inv.memory_bytes > 0);
    }
}
