//! Network faults as a user's network has them, made with nftables on the loopback
//! addresses the dev cluster uses: a [`Partition`] cuts one node off from every other
//! until it is dropped. Needs root and `nft` (`.ci/run` installs nftables).

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// One node cut off: every packet from or to its address is dropped (on loopback every
/// packet passes the output hook once, so one rule per direction is enough). Healed when
/// dropped.
pub struct Partition {
    table: String,
}

fn nft(script: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .arg("-f")
        .arg("-")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, script.as_bytes())
            .map_err(|e| format!("nft stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Whether nftables can be used here (root, `nft` installed, kernel support).
pub fn available() -> bool {
    nix::unistd::Uid::effective().is_root() && nft("list tables").is_ok()
}

impl Partition {
    /// Cuts `ip` off; panics if nftables refuses.
    pub fn isolate(ip: Ipv4Addr) -> Partition {
        let table = format!("shoal_test_{}", ip.to_string().replace('.', "_"));
        let script = format!(
            "table ip {table} {{\n\
             \tchain out {{\n\
             \t\ttype filter hook output priority 0; policy accept;\n\
             \t\tip saddr {ip} ip daddr != {ip} drop\n\
             \t\tip daddr {ip} ip saddr != {ip} drop\n\
             \t}}\n\
             }}\n"
        );
        // A table left by a crashed run of the same test goes first.
        let _ = nft(&format!("delete table ip {table}\n"));
        nft(&script).unwrap_or_else(|e| panic!("nft refused the partition of {ip}: {e}"));
        Partition { table }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if let Err(e) = nft(&format!("delete table ip {}\n", self.table)) {
            eprintln!("could not heal the partition ({}): {e}", self.table);
        }
    }
}
