//! Files held under the agent's directory lease, as this mount saw them answered.
//!
//! A file the agent created or changed under its lease (`FsResponse::Unsynced`) is
//! changed by no other node until the change feed says so: its attributes may be cached
//! in the kernel like a directory's ([`HeldFiles::contains`]), and the attributes of that
//! answer are what the agent would answer a `GetAttr` with, until this mount sends the
//! file another change. A setattr the mount holds with the file's buffered writes (cp -a:
//! chown, utimes and chmod after the data) is answered from them
//! ([`HeldFiles::attr`]) instead of asking the agent first: one round trip less each.
//! Directories too: a change answered under the lease carries its directory's attributes
//! after it (protocol 13), and the kernel's stat of the directory right after each of its
//! creates and unlinks (its permission check) is answered from them.
//!
//! "Until this mount sends another change" is kept by the agent connection's count of
//! changes sent ([`super::agent::Agent::changes_sent`]): an answer is remembered with the
//! count at its request's send, and used only while no change of any inode was sent since (a write, setattr, create, unlink, rename: the
//! mount does not know every inode a change touches, an unlink's for one). Conservative:
//! a busy mount falls back to asking; a cp -a, one file at a time, does not.

use std::collections::HashMap;
use std::sync::Mutex;

use shoal_agent_api::{FileAttr, Ino};

/// Files remembered as held; past it the set starts again.
const MAX_HELD: usize = 1 << 16;

#[derive(Default)]
pub struct HeldFiles {
    files: Mutex<HashMap<Ino, Held>>,
}

struct Held {
    attr: FileAttr,
    /// The change count when the request answered with `attr` was sent; `None` when the
    /// answer may not be the agent's latest view (another change was under way).
    at: Option<u64>,
}

impl HeldFiles {
    fn files(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, Held>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The agent answered file `attr.ino`'s attributes under its lease, to a request
    /// sent at change count `at` (`None`: held, but the answer may be stale; see
    /// [`super::agent::Agent::on_unsynced`]).
    pub fn hold(&self, attr: &FileAttr, at: Option<u64>) {
        let mut files = self.files();
        if files.len() >= MAX_HELD {
            files.clear();
        }
        let keep = match (files.get(&attr.ino).and_then(|h| h.at), at) {
            (Some(held), Some(at)) => held <= at,
            _ => true,
        };
        if keep {
            files.insert(
                attr.ino,
                Held {
                    attr: attr.clone(),
                    at,
                },
            );
        }
    }

    /// The mount answered the kernel `attr` for a file it holds, computed from
    /// [`HeldFiles::attr`] with nothing sent since (the change count is `now`): the base
    /// of the next such answer.
    pub fn answered(&self, attr: &FileAttr, now: u64) {
        if let Some(h) = self.files().get_mut(&attr.ino)
            && h.at == Some(now)
        {
            h.attr = attr.clone();
        }
    }

    /// Whether `ino` is held (no other node changed it since, as far as the feed said).
    pub fn contains(&self, ino: Ino) -> bool {
        self.files().contains_key(&ino)
    }

    /// The attributes the agent holds for `ino`, when the mount knows them: held, and
    /// no change sent since they were answered (the change count is `now`).
    pub fn attr(&self, ino: Ino, now: u64) -> Option<FileAttr> {
        self.files()
            .get(&ino)
            .filter(|h| h.at == Some(now))
            .map(|h| h.attr.clone())
    }

    /// Another node changed `ino` (or may have).
    pub fn remove(&self, ino: Ino) {
        self.files().remove(&ino);
    }

    /// Nothing is known held any more (a reset of the feed, a reconnect).
    pub fn clear(&self) {
        self.files().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::testkit::attr;

    #[test]
    fn an_answer_is_the_agents_view_until_the_mount_sends_another_change() {
        let held = HeldFiles::default();
        held.hold(&attr(7, 0), Some(1));
        assert!(held.contains(7));
        assert_eq!(held.attr(7, 1), Some(attr(7, 0)));
        // The mount's own answer on top (a held setattr) is the next base.
        held.answered(&attr(7, 10), 1);
        assert_eq!(held.attr(7, 1), Some(attr(7, 10)));
        // Any change sent (of any inode: an unlink names no inode) ends it, not the hold.
        assert_eq!(held.attr(7, 2), None);
        assert!(held.contains(7));
        held.answered(&attr(7, 20), 2);
        assert_eq!(
            held.attr(7, 2),
            None,
            "an answer over an unknown base is not one"
        );
    }

    #[test]
    fn an_answer_to_an_older_request_does_not_replace_a_newer_one() {
        let held = HeldFiles::default();
        held.hold(&attr(7, 2), Some(2));
        held.hold(&attr(7, 1), Some(1));
        assert_eq!(held.attr(7, 2), Some(attr(7, 2)));
        // Sent beside another change: held, with no view the mount may answer from.
        let held = HeldFiles::default();
        held.hold(&attr(7, 1), None);
        assert_eq!(held.attr(7, 1), None);
        assert!(held.contains(7));
        held.hold(&attr(7, 2), Some(3));
        assert_eq!(held.attr(7, 3), Some(attr(7, 2)));
        held.hold(&attr(7, 1), None);
        assert_eq!(
            held.attr(7, 3),
            None,
            "a later answer of unknown order wins"
        );
    }

    #[test]
    fn another_nodes_change_or_a_reset_forgets_the_file() {
        let held = HeldFiles::default();
        held.hold(&attr(7, 0), Some(0));
        held.hold(&attr(8, 0), Some(0));
        held.remove(7);
        assert!(!held.contains(7) && held.attr(7, 0).is_none());
        held.clear();
        assert!(!held.contains(8));
    }

    #[test]
    fn a_directorys_attributes_answered_with_a_change_in_it_hold_until_the_next_change() {
        let held = HeldFiles::default();
        let mut dir = attr(5, 0);
        dir.kind = shoal_agent_api::FileKind::Dir;
        dir.nlink = 3;
        held.hold(&dir, Some(4));
        assert_eq!(held.attr(5, 4), Some(dir.clone()));
        // Another node's change in it (the feed) drops it; so does any change sent here.
        held.remove(5);
        assert_eq!(held.attr(5, 4), None);
        held.hold(&dir, Some(5));
        assert_eq!(held.attr(5, 6), None);
    }
}
