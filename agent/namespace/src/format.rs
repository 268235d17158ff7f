//! The types the Raft log and the state carry, owned by this crate. The agent's API types
//! look the same today, but a change to the API must never change what is on disk or in
//! the log: the agent converts at the edge (the `From` impls below), and the golden-bytes
//! tests pin these encodings, so any change here is a visible, deliberate format change
//! that comes with a version bump (log records, snapshots, state records).
//!
//! The placement crate's `Layout`, `NodeId`, `StripeId` and `EcProfile` are carried as
//! they are: they are that crate's on-disk contract (its hash too), and the same tests pin
//! their bytes.

use serde::{Deserialize, Serialize};
use shoal_agent_api as api;
use shoal_placement::{EcProfile, NodeId, StripeId};

/// An inode number.
pub type Ino = u64;

/// Seconds and nanoseconds since the Unix epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

/// A mount session and its request sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId {
    pub client: u64,
    pub seq: u64,
}

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// An inode's owner and group at its creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// A time to set: the proposer's clock, or a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    Now,
    At(Timestamp),
}

/// Which attributes a `SetAttr` changes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

/// `rename` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

/// An inode's attributes, as an outcome carries them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAttr {
    pub ino: Ino,
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub rdev: u32,
}

/// Why the namespace refused a command (kept in the request table with the outcome).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsError {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    Invalid,
    NameTooLong,
    TooManyLinks,
    NoSpace,
    NotPermitted,
    TooBig,
    Unavailable(String),
    Io(String),
    /// Never written by the state machine (an open's answer); here so the API's twin
    /// converts both ways.
    Stale,
}

/// Where one shard of a stripe is, and its checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLocation {
    pub index: u8,
    pub node: NodeId,
    pub crc32c: u32,
}

/// Where a cold stripe's bytes are: `len` bytes at `offset` of object `object` in the
/// cold tier, with their crc32c.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdLocation {
    pub object: u128,
    pub offset: u64,
    pub len: u64,
    pub crc32c: u32,
}

/// A stripe as the metadata records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeRecord {
    pub id: StripeId,
    pub len: u64,
    pub ec: EcProfile,
    pub shard_len: u64,
    pub epoch: u64,
    pub shards: Vec<ShardLocation>,
}

/// Field-by-field conversions between a format type and its API twin, both ways.
macro_rules! twin_struct {
    ($name:ident { $($field:ident),* $(,)? }) => {
        impl From<api::$name> for $name {
            fn from(v: api::$name) -> Self {
                $name { $($field: v.$field.into()),* }
            }
        }
        impl From<$name> for api::$name {
            fn from(v: $name) -> Self {
                api::$name { $($field: v.$field.into()),* }
            }
        }
    };
}

macro_rules! twin_enum {
    ($name:ident { $($unit:ident),* $(,)? } $(, $tuple:ident)* ) => {
        impl From<api::$name> for $name {
            fn from(v: api::$name) -> Self {
                match v {
                    $(api::$name::$unit => $name::$unit,)*
                    $(api::$name::$tuple(x) => $name::$tuple(x.into()),)*
                }
            }
        }
        impl From<$name> for api::$name {
            fn from(v: $name) -> Self {
                match v {
                    $($name::$unit => api::$name::$unit,)*
                    $($name::$tuple(x) => api::$name::$tuple(x.into()),)*
                }
            }
        }
    };
}

twin_struct!(Timestamp { secs, nanos });
twin_struct!(RequestId { client, seq });
twin_struct!(Owner { uid, gid });
twin_struct!(RenameFlags {
    noreplace,
    exchange
});
twin_struct!(ShardLocation {
    index,
    node,
    crc32c
});
impl From<api::StripeRecord> for StripeRecord {
    fn from(v: api::StripeRecord) -> Self {
        StripeRecord {
            id: v.id,
            len: v.len,
            ec: v.ec,
            shard_len: v.shard_len,
            epoch: v.epoch,
            shards: v.shards.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<StripeRecord> for api::StripeRecord {
    fn from(v: StripeRecord) -> Self {
        api::StripeRecord {
            id: v.id,
            len: v.len,
            ec: v.ec,
            shard_len: v.shard_len,
            epoch: v.epoch,
            shards: v.shards.into_iter().map(Into::into).collect(),
        }
    }
}
twin_struct!(FileAttr {
    ino,
    kind,
    perm,
    nlink,
    uid,
    gid,
    size,
    atime,
    mtime,
    ctime,
    rdev
});
twin_enum!(FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice
});
twin_enum!(SetTime { Now }, At);
twin_enum!(
    FsError {
        NotFound,
        Exists,
        NotDir,
        IsDir,
        NotEmpty,
        Invalid,
        NameTooLong,
        TooManyLinks,
        NoSpace,
        NotPermitted,
        TooBig,
        Stale
    },
    Unavailable,
    Io
);

impl From<api::SetAttr> for SetAttr {
    fn from(v: api::SetAttr) -> Self {
        SetAttr {
            perm: v.perm,
            uid: v.uid,
            gid: v.gid,
            size: v.size,
            atime: v.atime.map(Into::into),
            mtime: v.mtime.map(Into::into),
        }
    }
}

impl From<SetAttr> for api::SetAttr {
    fn from(v: SetAttr) -> Self {
        api::SetAttr {
            perm: v.perm,
            uid: v.uid,
            gid: v.gid,
            size: v.size,
            atime: v.atime.map(Into::into),
            mtime: v.mtime.map(Into::into),
        }
    }
}

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        api::Timestamp::now().into()
    }
}

/// Equality across the twins (tests compare what a query answers, in API types, with what
/// they built, in these).
macro_rules! twin_eq {
    ($($name:ident),* $(,)?) => {
        $(
            #[allow(clippy::cmp_owned)]
            impl PartialEq<api::$name> for $name {
                fn eq(&self, other: &api::$name) -> bool {
                    api::$name::from(self.clone()) == *other
                }
            }
            #[allow(clippy::cmp_owned)]
            impl PartialEq<$name> for api::$name {
                fn eq(&self, other: &$name) -> bool {
                    *self == api::$name::from(other.clone())
                }
            }
        )*
    };
}

twin_eq!(
    Timestamp,
    RequestId,
    FileKind,
    Owner,
    SetTime,
    SetAttr,
    RenameFlags,
    FileAttr,
    FsError,
    ShardLocation,
    StripeRecord,
);
