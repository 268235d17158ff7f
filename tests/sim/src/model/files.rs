//! [`FileHistory`]: the contents one file went through, as its one writer wrote them,
//! and which of them the cluster acknowledged. A write that failed or timed out may or
//! may not have committed: its writer writes that file no more, and the file may hold
//! either its last acknowledged contents or those.

/// One file's contents, version by version (version 0 is the empty file of its create).
pub struct FileHistory {
    pub ino: u64,
    versions: Vec<Vec<u8>>,
    /// The newest acknowledged version and the event of its acknowledgement.
    acked: Vec<(usize, u64)>,
    /// A write's outcome was unknown: no more writes.
    pub settled: bool,
    /// Its unlink was sent: no read picks it any more.
    pub unlinked: bool,
    /// Its name surely names it: no rename onto it or from it has an unknown outcome.
    pub name_sure: bool,
}

impl FileHistory {
    /// A file whose create was acknowledged at event `at`.
    pub fn created(ino: u64, at: u64) -> Self {
        FileHistory {
            ino,
            versions: vec![Vec::new()],
            acked: vec![(0, at)],
            settled: false,
            unlinked: false,
            name_sure: true,
        }
    }

    /// The contents of the newest version.
    pub fn newest(&self) -> &[u8] {
        self.versions.last().map(Vec::as_slice).unwrap_or_default()
    }

    /// A write of `data` at `offset` is sent: its contents become the next version.
    pub fn writing(&mut self, offset: u64, data: &[u8]) {
        let mut next = self.newest().to_vec();
        let (offset, end) = (offset as usize, offset as usize + data.len());
        if next.len() < end {
            next.resize(end, 0);
        }
        next[offset..end].copy_from_slice(data);
        self.versions.push(next);
    }

    /// A truncation to `len` bytes is sent: its contents become the next version (cut,
    /// or extended with zeros).
    pub fn truncating(&mut self, len: u64) {
        let mut next = self.newest().to_vec();
        next.resize(len as usize, 0);
        self.versions.push(next);
    }

    /// The newest version was acknowledged at event `at`.
    pub fn acked(&mut self, at: u64) {
        self.acked.push((self.versions.len() - 1, at));
    }

    /// The version every read must see at least: the newest acknowledged before
    /// event `began`.
    fn floor(&self, began: u64) -> usize {
        self.acked
            .iter()
            .filter(|(_, at)| *at < began)
            .map(|(v, _)| *v)
            .max()
            .unwrap_or(0)
    }

    /// The newest acknowledged version.
    pub fn last_acked(&self) -> usize {
        self.acked.last().map_or(0, |(v, _)| *v)
    }

    /// Checks bytes read by a read that began at event `began`: they must be some version
    /// not older than the floor (a write in flight may show). The violation, if any.
    pub fn check(&self, read: &[u8], began: u64) -> Result<usize, String> {
        let floor = self.floor(began);
        match self.versions.iter().rposition(|v| v == read) {
            Some(v) if v >= floor => Ok(v),
            Some(v) => Err(format!(
                "stale contents: version {v} of {}, but version {floor} was acknowledged before the read began",
                self.versions.len() - 1
            )),
            None => Err(format!(
                "contents that no write made ({} bytes; {})",
                read.len(),
                describe_difference(read, &self.versions[floor])
            )),
        }
    }
}

/// Where `read` first differs from `expected`, in words.
fn describe_difference(read: &[u8], expected: &[u8]) -> String {
    match read.iter().zip(expected).position(|(a, b)| a != b) {
        Some(at) => format!(
            "first differs from the acknowledged version at byte {at} of {}",
            expected.len()
        ),
        None => format!(
            "the acknowledged version has {} bytes and the same prefix",
            expected.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_sees_the_acknowledged_version_or_a_newer_one_and_nothing_else() {
        let mut f = FileHistory::created(2, 1);
        f.writing(0, b"abc");
        f.acked(3);
        f.writing(1, b"XYZ");
        assert_eq!(f.check(b"", 2), Ok(0), "began before the ack");
        assert!(f.check(b"", 4).is_err(), "stale after the ack");
        assert_eq!(f.check(b"abc", 4), Ok(1));
        assert_eq!(f.check(b"aXYZ", 4), Ok(2), "the write in flight may show");
        assert!(f.check(b"abX", 4).is_err(), "torn");
        assert_eq!(f.last_acked(), 1);
    }

    #[test]
    fn bytes_cut_by_a_truncation_read_back_as_zeros_after_an_extending_write() {
        let mut f = FileHistory::created(2, 1);
        f.writing(0, b"abcdef");
        f.truncating(2);
        f.writing(4, b"Z");
        f.acked(2);
        assert_eq!(f.newest(), b"ab\0\0Z");
        assert!(f.check(b"abcdZ", 3).is_err(), "cut bytes came back");
    }
}
