//! Translations between the agent's types and the kernel's (through fuser).
//!
//! Regular files' attributes are not cached by the kernel (`--file-attr-ttl-ms`, 0), so
//! `open` and a stat by path (`GetAttrFresh`) take a read barrier on the agent. A stat of
//! an open file reads the local replica, and so does a stat of a directory: the kernel
//! drops a directory's attributes after each of its own creates and unlinks in it (two
//! `GETATTR`s per create), the replica has its own changes applied already, and other
//! nodes' changes reach the kernel through the change feed (`coherence.rs`). A held
//! setattr is answered with the buffered size ([`held`]).

use std::ffi::OsStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileType, INodeNo, TimeOrNow};
use shoal_agent_api::{FileAttr, FileKind, NAME_MAX, SetAttr, SetTime, Timestamp};

/// `st_blksize`: small enough that stdio buffers stay small, large enough for the page cache.
const BLKSIZE: u32 = 4096;

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// The kind of node `mknod` asks for, from the file-type bits of its mode.
pub fn kind_from_mode(mode: u32) -> Option<FileKind> {
    match mode & libc_consts::S_IFMT {
        libc_consts::S_IFREG | 0 => Some(FileKind::File),
        libc_consts::S_IFIFO => Some(FileKind::Fifo),
        libc_consts::S_IFSOCK => Some(FileKind::Socket),
        libc_consts::S_IFCHR => Some(FileKind::CharDevice),
        libc_consts::S_IFBLK => Some(FileKind::BlockDevice),
        _ => None,
    }
}

/// The file-type bits of `mode(2)` (the same on every Linux architecture).
mod libc_consts {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFSOCK: u32 = 0o140000;
    pub const S_IFREG: u32 = 0o100000;
    pub const S_IFBLK: u32 = 0o060000;
    pub const S_IFCHR: u32 = 0o020000;
    pub const S_IFIFO: u32 = 0o010000;
}

/// A time from the agent; one the kernel cannot hold becomes the epoch.
pub fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nanos.min(999_999_999)));
    let at = if t.secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.secs as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.secs.unsigned_abs()))
    };
    at.and_then(|at| at.checked_add(nanos))
        .unwrap_or(UNIX_EPOCH)
}

pub fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: d.subsec_nanos(),
        },
        Err(before) => {
            let d = before.duration();
            let secs = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() == 0 {
                Timestamp { secs, nanos: 0 }
            } else {
                Timestamp {
                    secs: secs - 1,
                    nanos: 1_000_000_000 - d.subsec_nanos(),
                }
            }
        }
    }
}

pub fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(at) => SetTime::At(timestamp(at)),
    }
}

/// The attributes a file has once `set` (no size change) is committed on `committed`
/// with `buffered_end` bytes of writes before it: the metadata's setattr, applied here to
/// answer a setattr the mount holds with the file's writes (`SetTime::Now` and the change
/// time are this clock's now, a moment before the commit's).
pub fn held(committed: &FileAttr, set: &SetAttr, buffered_end: u64) -> FileAttr {
    let now = Timestamp::now();
    let time = |t: SetTime| match t {
        SetTime::Now => now,
        SetTime::At(at) => at,
    };
    FileAttr {
        perm: set.perm.map_or(committed.perm, |p| p & 0o7777),
        uid: set.uid.unwrap_or(committed.uid),
        gid: set.gid.unwrap_or(committed.gid),
        size: committed.size.max(buffered_end),
        atime: set.atime.map_or(committed.atime, time),
        mtime: set.mtime.map_or(committed.mtime, time),
        ctime: now,
        ..committed.clone()
    }
}

/// The kernel's view of an inode's attributes.
pub fn to_kernel(a: &FileAttr) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// A name from the kernel as the agent takes it: UTF-8 and at most `NAME_MAX` bytes.
pub fn name(name: &OsStr) -> Result<String, Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    name.to_str().map(str::to_owned).ok_or(Errno::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn attr(size: u64) -> FileAttr {
        let t = Timestamp {
            secs: 1_700_000_000,
            nanos: 5,
        };
        FileAttr {
            ino: 42,
            kind: FileKind::File,
            perm: 0o104755,
            nlink: 1,
            uid: 1000,
            gid: 100,
            size,
            atime: t,
            mtime: t,
            ctime: t,
            rdev: 0,
        }
    }

    #[test]
    fn kernel_attrs_count_512_byte_blocks_and_keep_only_permission_bits() {
        let k = to_kernel(&attr(1025));
        assert_eq!(k.blocks, 3);
        assert_eq!(k.perm, 0o4755);
        assert_eq!(k.ino, INodeNo(42));
        assert_eq!(k.kind, FileType::RegularFile);
        assert_eq!(to_kernel(&attr(0)).blocks, 0);
        assert_eq!(to_kernel(&attr(512)).blocks, 1);
    }

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for t in [
            Timestamp { secs: 0, nanos: 0 },
            Timestamp {
                secs: 1_700_000_000,
                nanos: 999_999_999,
            },
            Timestamp {
                secs: -5,
                nanos: 250,
            },
        ] {
            assert_eq!(timestamp(system_time(t)), t);
        }
        let absurd = Timestamp {
            secs: i64::MAX,
            nanos: u32::MAX,
        };
        let _ = system_time(absurd);
    }

    #[test]
    fn names_must_be_utf8_and_short() {
        assert_eq!(name(OsStr::new("a.txt")), Ok("a.txt".to_owned()));
        assert_eq!(name(OsStr::from_bytes(b"\xff")), Err(Errno::EINVAL));
        let long = "x".repeat(NAME_MAX + 1);
        assert_eq!(name(OsStr::new(&long)), Err(Errno::ENAMETOOLONG));
    }

    #[test]
    fn mknod_modes_map_to_kinds() {
        assert_eq!(kind_from_mode(0o100644), Some(FileKind::File));
        assert_eq!(kind_from_mode(0o010644), Some(FileKind::Fifo));
        assert_eq!(kind_from_mode(0o020644), Some(FileKind::CharDevice));
        assert_eq!(kind_from_mode(0o040755), None);
    }
}
