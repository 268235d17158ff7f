//! [`RedbFile`]: redb's storage in a [`DiskFile`], so the replica runs on a simulated disk
//! with the same code as on the real one.

use std::io;
use std::sync::Arc;

use crate::DiskFile;

/// A redb storage backend over one [`DiskFile`].
#[derive(Debug)]
pub struct RedbFile(pub Arc<dyn DiskFile>);

impl redb::StorageBackend for RedbFile {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.0.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }
}
