//! Open directories: the entries fetched once at `opendir`, served by offset.
//!
//! Offsets are positions in the snapshot: 0 is ".", 1 is "..", 2.. the agent's entries.
//! Each entry is given the offset of the one after it, which the kernel passes back to
//! continue, so a listing stays consistent however the kernel splits it.

use shoal_agent_api::{DirEntry, FileKind, Ino};

/// One directory's entries as they were when it was opened.
#[derive(Debug)]
pub struct DirSnapshot {
    ino: Ino,
    parent: Ino,
    entries: Vec<DirEntry>,
}

/// One entry to hand the kernel: its inode, the offset to continue after it, its kind and
/// name.
#[derive(Debug, PartialEq, Eq)]
pub struct Listed<'a> {
    pub ino: Ino,
    pub next: u64,
    pub kind: FileKind,
    pub name: &'a str,
}

impl DirSnapshot {
    /// `parent` is reported as the inode of ".."; the kernel does not use it, so the
    /// directory's own inode does when the parent is unknown.
    pub fn new(ino: Ino, parent: Ino, entries: Vec<DirEntry>) -> Self {
        DirSnapshot {
            ino,
            parent,
            entries,
        }
    }

    /// The entries from `offset` on.
    pub fn listing_at(&self, offset: u64) -> impl Iterator<Item = Listed<'_>> {
        let dots = [(self.ino, "."), (self.parent, "..")]
            .into_iter()
            .map(|(ino, name)| (ino, FileKind::Dir, name));
        let rest = self
            .entries
            .iter()
            .map(|e| (e.ino, e.kind, e.name.as_str()));
        dots.chain(rest)
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .map(|(i, (ino, kind, name))| Listed {
                ino,
                next: i as u64 + 1,
                kind,
                name,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> DirSnapshot {
        let e = |name: &str, ino| DirEntry {
            name: name.into(),
            ino,
            kind: FileKind::File,
        };
        DirSnapshot::new(7, 1, vec![e("a", 10), e("b", 11), e("c", 12)])
    }

    #[test]
    fn listing_starts_with_dot_entries_and_offsets_point_past_each_entry() {
        let s = snapshot();
        let all: Vec<_> = s.listing_at(0).map(|l| (l.name, l.ino, l.next)).collect();
        assert_eq!(
            all,
            vec![
                (".", 7, 1),
                ("..", 1, 2),
                ("a", 10, 3),
                ("b", 11, 4),
                ("c", 12, 5)
            ]
        );
    }

    #[test]
    fn listing_resumes_at_the_offset_the_kernel_passes_back() {
        let s = snapshot();
        let first: Vec<_> = s.listing_at(0).take(3).collect();
        let resume = first.last().expect("three entries").next;
        let rest: Vec<_> = s.listing_at(resume).map(|l| l.name).collect();
        assert_eq!(rest, vec!["b", "c"]);
        assert_eq!(s.listing_at(5).count(), 0);
        assert_eq!(s.listing_at(u64::MAX).count(), 0);
    }
}
