//! Open directories: the entries fetched from the agent page by page, as the kernel reads
//! on, and served by offset.
//!
//! Offsets are positions in the listing: 0 is ".", 1 is "..", 2.. the agent's entries in
//! name order. Each entry is given the offset of the one after it, which the kernel passes
//! back to continue. Fetched entries are kept until the directory is closed, so a rewind or
//! a seek back gets the same names; the next page starts after the last name fetched, so
//! a listing shows no name twice however the directory changes meanwhile.
//!
//! Pages are `ReadDir` requests after a name, `--readdir-page` entries each (4,096 at
//! most): `opendir` fetches the first (at the leader's commit point), and a readdir that
//! reaches the end of what was fetched fetches the next.

use shoal_agent_api::{DirEntry, FileKind, Ino};

/// One open directory's entries fetched so far.
#[derive(Debug)]
pub struct Listing {
    ino: Ino,
    parent: Ino,
    entries: Vec<DirEntry>,
    /// The agent has more entries after the last one fetched.
    more: bool,
}

/// One entry to hand the kernel: its inode, the offset to continue after it, its kind and
/// name.
#[derive(Debug, PartialEq, Eq)]
pub struct Listed {
    pub ino: Ino,
    pub next: u64,
    pub kind: FileKind,
    pub name: String,
}

impl Listing {
    /// `parent` is reported as the inode of ".."; the kernel does not use it, so the
    /// directory's own inode does when the parent is unknown. `first` is the first page.
    pub fn new(ino: Ino, parent: Ino, first: Vec<DirEntry>, more: bool) -> Self {
        Listing {
            ino,
            parent,
            more: more && !first.is_empty(),
            entries: first,
        }
    }

    pub fn ino(&self) -> Ino {
        self.ino
    }

    /// Where the next page starts (after this name), when a read at `offset` needs one:
    /// the entries fetched end at or before it and the directory goes on.
    pub fn next_page_for(&self, offset: u64) -> Option<&str> {
        let fetched = self.entries.len() as u64 + 2;
        if offset < fetched || !self.more {
            return None;
        }
        self.entries.last().map(|e| e.name.as_str())
    }

    /// Adds the page that follows the entries fetched so far.
    pub fn append(&mut self, page: Vec<DirEntry>, more: bool) {
        // A page that brings nothing new ends the listing, whatever it says: asking again
        // would not get further.
        self.more = more && !page.is_empty();
        self.entries.extend(page);
    }

    /// At most `max` entries from `offset` on, of those fetched.
    pub fn listing_at(&self, offset: u64, max: usize) -> Vec<Listed> {
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
            .take(max)
            .map(|(i, (ino, kind, name))| Listed {
                ino,
                next: i as u64 + 1,
                kind,
                name: name.to_owned(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(name: &str, ino: Ino) -> DirEntry {
        DirEntry {
            name: name.into(),
            ino,
            kind: FileKind::File,
        }
    }

    fn listing() -> Listing {
        Listing::new(7, 1, vec![e("a", 10), e("b", 11), e("c", 12)], false)
    }

    fn names(l: &Listing, offset: u64) -> Vec<String> {
        l.listing_at(offset, usize::MAX)
            .into_iter()
            .map(|l| l.name)
            .collect()
    }

    #[test]
    fn listing_starts_with_dot_entries_and_offsets_point_past_each_entry() {
        let all: Vec<_> = listing()
            .listing_at(0, usize::MAX)
            .into_iter()
            .map(|l| (l.name, l.ino, l.next))
            .collect();
        let want = [
            (".", 7, 1),
            ("..", 1, 2),
            ("a", 10, 3),
            ("b", 11, 4),
            ("c", 12, 5),
        ];
        let want: Vec<_> = want.iter().map(|&(n, i, x)| (n.to_owned(), i, x)).collect();
        assert_eq!(all, want);
    }

    #[test]
    fn listing_resumes_at_the_offset_the_kernel_passes_back() {
        let l = listing();
        let first = l.listing_at(0, 3);
        let resume = first.last().expect("three entries").next;
        assert_eq!(names(&l, resume), ["b", "c"]);
        assert!(l.listing_at(5, 10).is_empty());
        assert!(l.listing_at(u64::MAX, 10).is_empty());
        assert_eq!(l.next_page_for(5), None, "the agent said there is no more");
    }

    #[test]
    fn pages_are_fetched_only_when_a_read_reaches_past_them() {
        let mut l = Listing::new(7, 1, vec![e("a", 10), e("b", 11)], true);
        // Offsets 0..=3 are ".", "..", "a", "b": all fetched.
        assert_eq!(l.next_page_for(3), None);
        assert_eq!(l.next_page_for(4), Some("b"));
        l.append(vec![e("c", 12)], true);
        assert_eq!(l.next_page_for(4), None);
        assert_eq!(l.next_page_for(5), Some("c"));
        l.append(vec![e("d", 13)], false);
        assert_eq!(l.next_page_for(6), None, "the directory ends at d");
        assert_eq!(names(&l, 2), ["a", "b", "c", "d"]);
        // A rewind gets the same names without asking the agent again.
        assert_eq!(l.next_page_for(0), None);
    }

    #[test]
    fn an_empty_page_ends_the_listing() {
        let mut l = Listing::new(7, 1, vec![e("a", 10)], true);
        l.append(Vec::new(), true);
        assert_eq!(l.next_page_for(3), None);
        let mut empty = Listing::new(7, 1, Vec::new(), true);
        assert_eq!(empty.next_page_for(2), None, "no name to continue after");
        empty.append(Vec::new(), false);
        assert_eq!(names(&empty, 0), [".", ".."]);
    }
}
