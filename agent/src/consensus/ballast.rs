//! Space the metadata can always write: a ballast file beside the Raft log, given up when
//! the filesystem is nearly full and made again once there is room.
//!
//! Any failed write to the Raft log stops Raft on the node, and the shard store (which
//! keeps `storage.reserve` free) is not the only user of the filesystem. So at start the
//! agent sets [`BALLAST_BYTES`] aside in `meta/reserve.bin`; a log write that finds less
//! than [`LOW_WATER`] free first deletes the ballast, and says so loudly (an ERROR). The
//! file is `fallocate`d at start when the filesystem has room, and the `facts` worker sets
//! it aside again once there is room ([`Ballast::restore`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{error, info, warn};

/// Bytes set aside for the metadata.
pub const BALLAST_BYTES: u64 = 64 << 20;
/// Free bytes under which the ballast is given up before a log write.
const LOW_WATER: u64 = 16 << 20;

pub struct Ballast {
    path: PathBuf,
    held: AtomicBool,
}

/// Bytes free on the filesystem holding `path` (`u64::MAX` when unknown: never act on a
/// failed probe).
fn free_bytes(path: &Path) -> u64 {
    nix::sys::statvfs::statvfs(path)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(u64::MAX)
}

impl Ballast {
    /// Sets the ballast aside in `dir` (or keeps the one there). A filesystem without room
    /// for it leaves the node without one: logged, not fatal.
    pub fn open(dir: &Path) -> Ballast {
        let b = Ballast {
            path: dir.join("reserve.bin"),
            held: AtomicBool::new(false),
        };
        b.restore();
        b
    }

    /// No ballast, and none made: the simulator's members, whose disk is not a
    /// filesystem anyone else fills.
    pub fn absent() -> Ballast {
        Ballast {
            path: PathBuf::new(),
            held: AtomicBool::new(false),
        }
    }

    /// Whether the ballast is set aside now.
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// Before a log write: gives the ballast up if the filesystem is nearly full.
    pub fn before_write(&self) {
        if !self.held() || free_bytes(&self.path) >= LOW_WATER {
            return;
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {
                self.held.store(false, Ordering::Relaxed);
                error!(
                    path = %self.path.display(),
                    "the metadata's filesystem is nearly full: released its {} MiB reserve so the metadata log can go on; free space on this node now",
                    BALLAST_BYTES >> 20
                );
            }
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "cannot release the metadata reserve")
            }
        }
    }

    /// Sets the ballast aside again once the filesystem has room for it and more.
    pub fn restore(&self) {
        if self.held() || self.path.as_os_str().is_empty() {
            return;
        }
        if std::fs::metadata(&self.path).is_ok_and(|m| m.len() >= BALLAST_BYTES) {
            self.held.store(true, Ordering::Relaxed);
            return;
        }
        if free_bytes(self.path.parent().unwrap_or(Path::new("."))) < 4 * BALLAST_BYTES {
            return;
        }
        match write_ballast(&self.path) {
            Ok(()) => {
                self.held.store(true, Ordering::Relaxed);
                info!(path = %self.path.display(), "set {} MiB aside for the metadata", BALLAST_BYTES >> 20);
            }
            Err(e) => {
                let _ = std::fs::remove_file(&self.path);
                warn!(path = %self.path.display(), error = %e, "cannot set space aside for the metadata");
            }
        }
    }
}

/// Allocates the ballast's blocks (not a sparse file: its space must be taken), writing
/// zeros where the filesystem cannot allocate without writing.
fn write_ballast(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let len = i64::try_from(BALLAST_BYTES).unwrap_or(i64::MAX);
    match nix::fcntl::fallocate(&f, nix::fcntl::FallocateFlags::empty(), 0, len) {
        Ok(()) => {}
        Err(nix::errno::Errno::EOPNOTSUPP) => {
            let chunk = vec![0u8; 1 << 20];
            for _ in 0..(BALLAST_BYTES >> 20) {
                f.write_all(&chunk)?;
            }
        }
        Err(e) => return Err(e.into()),
    }
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ballast_is_set_aside_and_kept_across_restarts() {
        let dir = tempfile::tempdir().expect("tmp");
        let b = Ballast::open(dir.path());
        assert!(b.held());
        let len = std::fs::metadata(dir.path().join("reserve.bin"))
            .expect("ballast")
            .len();
        assert_eq!(len, BALLAST_BYTES);
        // Plenty free here: nothing is given up.
        b.before_write();
        assert!(b.held());
        drop(b);
        assert!(
            Ballast::open(dir.path()).held(),
            "the existing file is taken over"
        );
    }
}
