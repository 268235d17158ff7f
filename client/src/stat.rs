//! `shoal stat PATH`: where a file on a shoal mount keeps its data.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context, bail};
use shoal_agent_api::{
    AgentClient, ColdExtent, Failure, FileLayout, FsRequest, FsResponse, Request, Response,
};

/// `f_type` of every FUSE filesystem (statfs(2)).
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Whether `path` is on a FUSE filesystem.
pub fn on_fuse(path: &Path) -> anyhow::Result<bool> {
    let fs = nix::sys::statfs::statfs(path)
        .with_context(|| format!("cannot statfs {}", path.display()))?;
    Ok(fs.filesystem_type().0 as i64 == FUSE_SUPER_MAGIC)
}

pub fn run(path: &Path, socket: &Path, json: bool) -> anyhow::Result<()> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| {
        let what = format!("cannot stat {}: {e}", path.display());
        if e.kind() == std::io::ErrorKind::NotFound {
            crate::failure::not_found(what)
        } else {
            anyhow::anyhow!(what)
        }
    })?;
    if !on_fuse(path)? {
        return Err(crate::failure::invalid(format!(
            "{} is not on a shoal mount",
            path.display()
        )));
    }
    let ino = meta.ino();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (response, cold) = rt.block_on(async {
        let mut client = AgentClient::connect(socket).await?;
        let layout = client.call(&Request::Fs(FsRequest::Layout { ino })).await?;
        // An agent without a cold tier (or of an older release) answers with an error:
        // then nothing is cold.
        let cold = match client.call(&Request::ColdExtents { ino }).await {
            Ok(Response::ColdExtents(c)) => c,
            _ => Vec::new(),
        };
        Ok::<_, shoal_agent_api::ApiError>((layout, cold))
    })?;
    let layout = match response.into_result()? {
        Response::Fs(FsResponse::Layout(l)) => l,
        Response::Fs(FsResponse::Error(e)) => {
            return Err(Failure::new(e.kind(), format!("agent: {e}")).into());
        }
        _ => bail!("unexpected answer from the agent"),
    };
    if json {
        // The layout's fields, and where its cold extents are.
        #[derive(serde::Serialize)]
        struct Stat<'a> {
            #[serde(flatten)]
            layout: &'a FileLayout,
            cold_extents: &'a [ColdExtent],
        }
        let stat = Stat {
            layout: &layout,
            cold_extents: &cold,
        };
        println!("{}", serde_json::to_string_pretty(&stat)?);
    } else {
        print!("{}", render(path, &layout, &cold));
    }
    Ok(())
}

/// The human-readable layout: each extent's stripe and shards, or for a cold one the
/// object and byte range in the bucket.
pub fn render(path: &Path, layout: &FileLayout, cold: &[ColdExtent]) -> String {
    let a = &layout.attr;
    let mut out = String::new();
    let _ = writeln!(out, "{}", path.display());
    let _ = writeln!(out, "  inode   {}", a.ino);
    let _ = writeln!(out, "  size    {} bytes", a.size);
    let _ = writeln!(out, "  inline  {} bytes", layout.inline_len);
    let _ = writeln!(out, "  extents {}", layout.extents.len());
    for e in &layout.extents {
        let s = &e.stripe;
        let _ = writeln!(
            out,
            "  [{}, {})  stripe {}  ec {}  epoch {}  stripe bytes [{}, {})",
            e.offset,
            e.offset.saturating_add(e.len),
            s.id,
            s.ec,
            s.epoch,
            e.stripe_offset,
            e.stripe_offset.saturating_add(e.len),
        );
        if let Some(c) = cold.iter().find(|c| c.stripe == s.id) {
            let _ = writeln!(
                out,
                "      cold   object {}  bytes [{}, {})",
                c.object,
                c.offset,
                c.offset.saturating_add(c.len)
            );
            continue;
        }
        let shards: Vec<String> = s
            .shards
            .iter()
            .map(|sh| {
                if sh.node.is_none() {
                    format!("{}→missing", sh.index)
                } else {
                    format!("{}→{}", sh.index, sh.node)
                }
            })
            .collect();
        let _ = writeln!(out, "      shards {}", shards.join("  "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_agent_api::{
        EcProfile, Extent, FileAttr, FileKind, NodeId, ShardLocation, StripeId, StripeRecord,
        Timestamp,
    };

    #[test]
    fn layout_lists_each_extent_with_its_stripe_and_shards() {
        let layout = FileLayout {
            attr: FileAttr {
                ino: 9,
                kind: FileKind::File,
                perm: 0o644,
                nlink: 1,
                uid: 0,
                gid: 0,
                size: 100,
                atime: Timestamp::default(),
                mtime: Timestamp::default(),
                ctime: Timestamp::default(),
                rdev: 0,
            },
            inline_len: 0,
            extents: vec![Extent {
                offset: 0,
                len: 100,
                stripe_offset: 0,
                stripe: StripeRecord {
                    id: StripeId(0xab),
                    len: 100,
                    ec: "2+1".parse::<EcProfile>().expect("profile"),
                    shard_len: 64,
                    epoch: 3,
                    shards: (0..3)
                        .map(|i| ShardLocation {
                            index: i,
                            node: NodeId(u64::from(i) + 1),
                            crc32c: 0,
                        })
                        .collect(),
                },
            }],
        };
        let text = render(Path::new("/mnt/f"), &layout, &[]);
        assert!(text.contains("size    100 bytes"), "{text}");
        assert!(
            text.contains("[0, 100)  stripe 000000000000000000000000000000ab  ec 2+1  epoch 3"),
            "{text}"
        );
        assert!(text.contains("0→0000000000000001"), "{text}");
        assert!(on_fuse(Path::new("/")).is_ok());
        // A cold extent shows its object and range instead of shards.
        let cold = [ColdExtent {
            stripe: StripeId(0xab),
            object: "objects/00000000000000000000000000000007".into(),
            offset: 16,
            len: 100,
        }];
        let text = render(Path::new("/mnt/f"), &layout, &cold);
        assert!(
            text.contains(
                "cold   object objects/00000000000000000000000000000007  bytes [16, 116)"
            ),
            "{text}"
        );
        assert!(!text.contains("shards"), "{text}");
    }
}
