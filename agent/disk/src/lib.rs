//! The disk seam: a directory tree of files as the metadata log (`meta/log/`) and the
//! replica (`state.redb`) use it, behind [`Disk`] and [`DiskFile`].
//!
//! Read first: [`Disk`], then [`SimDisk`]. [`OsDisk`] is the real filesystem; [`SimDisk`]
//! keeps every file in memory and holds each write volatile until it is synced, as a
//! page cache does: [`SimDisk::power_cut`] throws away (or tears, a sector at a time) what
//! was not synced, and forgets directory entries whose directory was not synced. One
//! contract suite (`contract.rs`) runs against both. [`RedbFile`] lets redb keep its
//! database in a [`DiskFile`].
//!
//! This crate must never depend on tokio or on any shoal crate: it is the bottom layer.

#![forbid(unsafe_code)]

mod os;
mod redb_file;
mod sim;

#[cfg(test)]
mod contract;

use std::fmt::Debug;
use std::io;
use std::path::Path;
use std::sync::Arc;

pub use os::OsDisk;
pub use redb_file::RedbFile;
pub use sim::{SimDisk, SimFault, SplitMix64};

/// One open file: positioned reads and writes, its length, and a sync.
pub trait DiskFile: Debug + Send + Sync {
    /// Fills `buf` from `offset`; an error if the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset` (the file grows as needed, zero-filled).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// The file's length.
    fn len(&self) -> io::Result<u64>;
    /// Cuts or extends (with zeros) the file to `len`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes every write and length change so far durable (`fdatasync`).
    fn sync(&self) -> io::Result<()>;
    /// Drops what the page cache holds of the file that is not dirty, so the next reads
    /// come from the disk. After a failed sync Linux marks the pages it could not write
    /// clean but keeps them: a restarted reader would otherwise read bytes the disk never
    /// got, and a later successful sync would not write them.
    fn forget_cached(&self) -> io::Result<()>;

    /// The whole file.
    fn read_all(&self) -> io::Result<Vec<u8>> {
        let len = usize::try_from(self.len()?).map_err(io::Error::other)?;
        let mut out = vec![0; len];
        self.read_exact_at(&mut out, 0)?;
        Ok(out)
    }

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
}

/// A tree of directories and files. Creating, renaming and removing a file changes its
/// directory, which is durable only once [`Disk::sync_dir`] has synced that directory.
pub trait Disk: Debug + Send + Sync {
    /// Opens `path` for reading and writing; with `create`, creates it (empty) if missing.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>>;
    /// Creates `path` (empty, replacing a file there) and opens it.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn DiskFile>>;
    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path) -> bool;
    /// The names in directory `dir` (files and directories), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Removes the file at `path`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing a file there.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of directory `dir` (files created, renamed or removed in it)
    /// durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Replaces `path` with `bytes` so that a crash or power loss leaves either the old content
/// or the new, never neither: write a temporary file (`path` with the extension `tmp`),
/// sync it, rename it over the old one, then sync the directory (the rename lives in the
/// directory; without that sync a power loss can forget it after the call returned).
pub fn replace_file(disk: &dyn Disk, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let file = disk.create(&tmp)?;
    file.write_all_at(bytes, 0)?;
    file.sync()?;
    drop(file);
    disk.rename(&tmp, path)?;
    disk.sync_dir(parent(path))
}

/// The directory `path` lies in (`.` for a bare name).
pub fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}
